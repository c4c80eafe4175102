"""Fetching image URLs in the frontend, only with ``--allow-image-fetch``.

By default image URLs go to the engine as the client gave them and the frontend fetches nothing: a
server that fetches whatever URL a client names can be made to reach hosts only it can reach
(SSRF). With the flag, each http(s) image is fetched here, within ``--image-fetch-timeout`` and
``--image-fetch-max-bytes``, must be served as ``image/*``, and goes to the engine as a base64
data URL; a failure is the client's 400. Redirects are followed (at most 3, http(s) only). Images
of one request are fetched one after another, so a failure leaves no fetch running.

httpx is imported at the first fetch, in a worker thread (its ~35 ms import would stall the event
loop), not with this module: a frontend that fetches no image does not pay it at every start.
"""

from __future__ import annotations

import base64
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from trio_direct.core import errors

if TYPE_CHECKING:
    import httpx

__all__ = ["ImageFetchError", "ImageFetchLimits", "fetch_image", "inline_images"]

#: Bytes above which base64-encoding a fetched image goes to a worker thread.
_THREAD_THRESHOLD_BYTES = 1 << 20
_MAX_REDIRECTS = 3


@dataclass(frozen=True, slots=True)
class ImageFetchLimits:
    max_bytes: int
    #: Seconds one image may take, connect to last byte.
    timeout: float


class ImageFetchError(Exception):
    """An image URL could not be turned into an image (a client error)."""


async def inline_images(urls: Sequence[str], params: Sequence[str], limits: ImageFetchLimits) -> list[str]:
    """`urls` with every http(s) one replaced by the fetched image's data URL."""
    out = list(urls)
    remote = [i for i, url in enumerate(urls) if url[:8].lower().startswith(("http://", "https://"))]
    if not remote:
        return out
    if "httpx" not in sys.modules:  # the first fetch: the import blocks, off the loop
        await trio.to_thread.run_sync(importlib.import_module, "httpx")
    import httpx

    timeout = httpx.Timeout(limits.timeout)
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=True, max_redirects=_MAX_REDIRECTS) as client:
        for index in remote:
            try:
                out[index] = await fetch_image(client, urls[index], limits)
            except ImageFetchError as error:
                param = params[index] if index < len(params) else None
                raise errors.invalid_request(f"Could not fetch the image at '{param}': {error}", param=param) from None
    return out


async def fetch_image(client: httpx.AsyncClient, url: str, limits: ImageFetchLimits) -> str:
    """The image at `url` as a base64 data URL; `ImageFetchError` says why not."""
    import httpx  # imported already: `client` is one of its clients

    deadline = trio.current_time() + limits.timeout
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ImageFetchError(f"the server answered {response.status_code}")
            media = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if not media.startswith("image/"):
                raise ImageFetchError(f"it is not an image ({media or 'no content type'})")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limits.max_bytes:
                raise ImageFetchError(f"it is larger than {limits.max_bytes} bytes")
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > limits.max_bytes:
                    raise ImageFetchError(f"it is larger than {limits.max_bytes} bytes")
                if trio.current_time() > deadline:
                    raise ImageFetchError(f"it took longer than {limits.timeout:g}s")
    except httpx.TimeoutException:
        raise ImageFetchError(f"it took longer than {limits.timeout:g}s") from None
    except httpx.HTTPError as error:
        raise ImageFetchError(str(error) or type(error).__name__) from None
    if not data:
        raise ImageFetchError("it is empty")
    if len(data) > _THREAD_THRESHOLD_BYTES:
        encoded = await trio.to_thread.run_sync(base64.b64encode, bytes(data))
    else:
        encoded = base64.b64encode(data)
    return f"data:{media};base64,{encoded.decode('ascii')}"
