"""Find where one JSON or Python-literal value ends, a chunk at a time, without reparsing.

Re-parsing a growing prefix on every delta is quadratic and, worse, brace counting that ignores
strings cuts values at a `}` inside a string (sglang#31915). These scanners keep the nesting
depth and string state between chunks, so each character is looked at once.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["BROKEN", "JsonValueScanner", "PythonValueScanner"]

# `scan()` result: the value cannot continue at this index (a character no JSON value has
# outside strings, such as the `<` of a closing tag); the value is malformed up to there.
BROKEN: Final = -2

# Outside strings: brackets and quotes matter, and anything that cannot appear in JSON ends it.
_JSON_STRUCTURE: Final = re.compile(r'[{}\[\]"]|[^,:\s0-9.+\-a-zA-Z]')
_JSON_IN_STRING: Final = re.compile(r'["\\]')
_JSON_SCALAR_END: Final = re.compile(r"[^0-9.+\-a-zA-Z]")  # numbers, true, false, null


class JsonValueScanner:
    """Tracks one JSON value (object, array, string or scalar) from its first character.

    `scan(text, start, final)` consumes `text[start:]` and returns the index just past the value,
    `None` if the value continues beyond `text`, or `BROKEN` (see above) with `broken_at` set.
    A scalar (`12`, `true`) only ends at a delimiter, so it ends at `len(text)` when `final`.
    """

    __slots__ = ("_depth", "_escape", "_in_string", "_kind", "broken_at")

    def __init__(self) -> None:
        self._kind = ""  # "" before the first character, then "container", "string" or "scalar"
        self._depth = 0
        self._in_string = False
        self._escape = False  # a backslash ended the previous chunk
        self.broken_at = -1

    def scan(self, text: str, start: int, final: bool = False) -> int | None:
        i = start
        n = len(text)
        if i >= n:
            return n if final and self._kind == "scalar" else None
        if not self._kind:
            first = text[i]
            if first in "{[":
                self._kind, self._depth = "container", 1
                i += 1
            elif first == '"':
                self._kind, self._in_string = "string", True
                i += 1
            else:
                self._kind = "scalar"
        if self._kind == "scalar":
            found = _JSON_SCALAR_END.search(text, i)
            if found is None:
                return n if final else None
            return found.start()
        while i < n:
            if self._escape:
                self._escape = False
                i += 1
                continue
            if self._in_string:
                found = _JSON_IN_STRING.search(text, i)
                if found is None:
                    return None
                i = found.start()
                if text[i] == "\\":
                    if i + 1 >= n:
                        self._escape = True
                        return None
                    i += 2
                    continue
                self._in_string = False
                i += 1
                if self._kind == "string":
                    return i
                continue
            found = _JSON_STRUCTURE.search(text, i)
            if found is None:
                return None
            i = found.start()
            char = text[i]
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
            else:
                self.broken_at = i
                return BROKEN
            i += 1
        return None


class PythonValueScanner:
    """Tracks one Python literal argument (`f(a=<value>, ...)`) up to the `,` or `)` ending it.

    `scan(text, start)` consumes `text[start:]` and returns the index of that ending character
    (not consumed), or `None` if the value continues beyond `text`. Quotes are `'` or `"` with
    backslash escapes; brackets of all three kinds nest.
    """

    __slots__ = ("_depth", "_escape", "_quote")

    _SPECIAL: Final = re.compile(r"""[()\[\]{},'"]""")

    def __init__(self) -> None:
        self._depth = 0
        self._quote = ""
        self._escape = False

    def scan(self, text: str, start: int) -> int | None:
        i, n = start, len(text)
        while i < n:
            if self._escape:
                self._escape = False
                i += 1
                continue
            if self._quote:
                close = self._quote
                j = i
                while j < n and text[j] not in (close, "\\"):
                    j += 1
                if j >= n:
                    return None
                if text[j] == "\\":
                    if j + 1 >= n:
                        self._escape = True
                        return None
                    i = j + 2
                    continue
                self._quote = ""
                i = j + 1
                continue
            found = self._SPECIAL.search(text, i)
            if found is None:
                return None
            i = found.start()
            char = text[i]
            if char in "'\"":
                self._quote = char
            elif char in "([{":
                self._depth += 1
            elif char in ")]}":
                if self._depth == 0:
                    return i
                self._depth -= 1
            elif self._depth == 0:  # a top-level comma
                return i
            i += 1
        return None
