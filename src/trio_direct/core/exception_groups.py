"""Giving a lone exception back from a nursery that wrapped it.

A nursery wraps whatever leaves it in an exception group, including an exception raised by the body
of a context manager built around one. Callers of such context managers (`open_stream`,
`run_choices`) should be able to ``except EngineError`` as if no nursery were there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def unwrap_single_exception() -> Iterator[None]:
    """Re-raise a group holding one exception as that exception; other groups pass unchanged."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            only = group.exceptions[0]
            raise only from only.__cause__
        raise
