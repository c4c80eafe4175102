"""Engine addresses as users write them on the command line.

SGLang's own launch docs, smg and Dynamo spell an engine's gRPC address in several ways
(``http://h:p``, ``grpc://h:p``, ``h:p``); all of them name the same plaintext HTTP/2 endpoint, so all
are accepted. Anything else fails here with a message that says what is wrong, before any dialling.
"""

from __future__ import annotations

_SCHEMES = ("http", "grpc")


def parse_engine_url(url: str) -> tuple[str, int]:
    """The gRPC ``(host, port)`` of an engine URL; IPv6 hosts come back without brackets.

    Raises `ValueError` naming the URL and the problem (no port, bad port, unknown scheme, a path).
    """
    text = url.strip()
    if not text:
        raise ValueError("empty engine URL")
    rest = text
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme.lower() not in _SCHEMES:
            raise ValueError(
                f"engine URL {url!r}: unknown scheme {scheme!r}"
                " (use http://, grpc:// or host:port; TLS is not supported)"
            )
    rest = rest.removesuffix("/")
    if any(c in rest for c in "/?#@"):
        raise ValueError(f"engine URL {url!r}: only host:port is allowed, without a path, query or user")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise ValueError(f"engine URL {url!r}: unclosed '[' in an IPv6 address")
        host, after = rest[1:close], rest[close + 1 :]
        if not after:
            raise ValueError(f"engine URL {url!r}: no port (write [{host}]:PORT)")
        if not after.startswith(":"):
            raise ValueError(f"engine URL {url!r}: expected ':PORT' after the IPv6 address")
        port_text = after[1:]
    else:
        if ":" not in rest:
            raise ValueError(f"engine URL {url!r}: no port (write {rest or 'HOST'}:PORT)")
        host, port_text = rest.rsplit(":", 1)
        if ":" in host:
            raise ValueError(f"engine URL {url!r}: put an IPv6 address in brackets, e.g. [::1]:PORT")
    if not host:
        raise ValueError(f"engine URL {url!r}: no host")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise ValueError(f"engine URL {url!r}: bad port {port_text!r} (1-65535)")
    return host, int(port_text)
