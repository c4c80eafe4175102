"""Every line about a request names it, also from the tasks the request starts."""

from __future__ import annotations

import io
import logging

import trio

from trio_direct.logs import REQUEST_ID, configure_logging


async def test_a_request_id_reaches_the_lines_of_its_child_tasks():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    configure_logging("info", stream)
    try:
        log = logging.getLogger("trio_direct.test")

        async def child() -> None:
            log.info("from a child task")

        async def request() -> None:
            REQUEST_ID.set("chatcmpl-abc")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request)
        log.info("outside any request")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = stream.getvalue().splitlines()
    assert "[chatcmpl-abc] from a child task" in lines[0]
    assert "[-] outside any request" in lines[1]
