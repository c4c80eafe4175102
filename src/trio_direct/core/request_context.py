"""Who a request is: the id clients and logs know it by, and the engine request ids derived from it.

The HTTP layer creates a `RequestContext` when a generation request arrives (`X-Request-Id` from the
client, or a generated id), returns its id in the response's ``x-request-id`` header, and sets it
for the request's task (`CURRENT`, inherited by every task the request starts); planning reads it
to name the engine requests.

Engine request ids (rids) must never be a prefix of another live rid: SGLang's scheduler aborts by
prefix. Every rid is therefore of one of two fixed-length shapes:

- ``KEY INDEX`` (36 hex characters) when the client sent no id;
- ``TAG KEY INDEX`` (52 characters) when it did, where ``TAG`` is the client's id sanitised to
  ``[A-Za-z0-9._-]``, cut or padded with ``-`` to 15 characters, then one ``-``.

``KEY`` is 32 random hex characters, ``INDEX`` the choice as 4 hex digits. Within a shape all rids
have the same length, so none is a prefix of another; across shapes a 36-character rid is all hex
while the first 36 characters of a tagged one hold the tag's last ``-``, so neither is a prefix of
the other either. A continuation of a migrated stream gets a fresh ``KEY`` with the same tag.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CURRENT",
    "MAX_CLIENT_ID",
    "MAX_SESSION_KEY",
    "RequestContext",
    "engine_rid",
    "new_request_key",
    "rid_tag",
    "session_key",
]

#: The longest `X-Request-Id` taken as given; a longer (or non-printable) one is replaced.
MAX_CLIENT_ID = 200
_TAG_BODY = 15
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def new_request_key() -> str:
    """32 random hex characters (as random as uuid4().hex, without building a UUID)."""
    return os.urandom(16).hex()


def rid_tag(client_id: str) -> str:
    """The fixed-length rid prefix for a client's request id (16 characters, ends with ``-``)."""
    return _UNSAFE.sub("_", client_id[:_TAG_BODY]).ljust(_TAG_BODY, "-") + "-"


def engine_rid(tag: str, key: str, index: int) -> str:
    """One engine request's id: ``TAG KEY INDEX`` (see the module docstring)."""
    return f"{tag}{key}{index:04x}"


@dataclass(slots=True)
class RequestContext:
    """One request's identity, and its trace when tracing is on."""

    #: What logs and the ``x-request-id`` response header show: the client's id, else `key`.
    request_id: str
    #: 32 random hex characters: the response's id (``chatcmpl-KEY``) and its rids are built on it.
    key: str
    #: The rid prefix: empty, or `rid_tag` of the client's id.
    tag: str = ""
    #: The request's `tracing.RequestTrace`, when tracing is on.
    trace: Any = None
    #: What the access log reports beside the HTTP exchange: the engine(s) the request went to
    #: (``e1``, ``e0 + e1`` for a prefill/decode pair) and its token counts, once known.
    engine: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: The tenant it is served for (`tenants`), for logs and traces ("anonymous" without tenants).
    tenant: str = ""

    @classmethod
    def for_client_id(cls, value: bytes | None) -> RequestContext:
        """The context of a request whose ``X-Request-Id`` header was `value` (None: not sent).

        A usable id is printable ASCII without spaces, at most `MAX_CLIENT_ID` characters; anything
        else is ignored (and a fresh id generated), so that it can go into a header, a log line and a
        rid unchanged.
        """
        key = new_request_key()
        if value:
            text = value.decode("latin-1")
            if len(text) <= MAX_CLIENT_ID and text.isascii() and text.isprintable() and " " not in text:
                return cls(text, key, rid_tag(text))
        return cls(key, key)


#: The request the current task serves (None outside the HTTP layer: tests, benchmarks).
CURRENT: ContextVar[RequestContext | None] = ContextVar("request_context", default=None)


#: The longest session key kept (X-Session-ID, or the `user` field).
MAX_SESSION_KEY = 256


def session_key(header: str | None, user: object = None, *, from_user: bool = False) -> str | None:
    """A request's session key: the header's value, else the ``user`` field when `from_user`.

    Blank values are no key; keys are cut to `MAX_SESSION_KEY` characters so a client cannot
    grow the affinity table's memory by its key's length."""
    for value, wanted in ((header, True), (user, from_user)):
        if wanted and isinstance(value, str) and value.strip():
            return value.strip()[:MAX_SESSION_KEY]
    return None
