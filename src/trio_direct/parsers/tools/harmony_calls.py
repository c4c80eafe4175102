"""gpt-oss harmony tool calls: a message whose header names a recipient (gpt_oss).

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"location": "Paris"}<|call|>

The recipient may also sit in the role part (`<|start|>assistant to=functions.x<|channel|>...`,
as harmony's own encoder writes it), and the first message of a turn lacks `<|start|>assistant`
(the prompt ends with it). `functions.NAME` calls the client's function NAME; another recipient
(a built-in tool) is reported under its full name, for the client to reject.

The markers are plain strings to this parser, so it reads special-token text and text from a
tokenizer that lacks the tokens alike. `<|call|>` is a stop token the engine usually drops: the
end of the stream ends a call as well. Run after the `gpt_oss` reasoning parser, which passes
call messages through raw and takes `analysis` out; without it, non-call messages are content,
markers included (the text is never lost).
"""

from __future__ import annotations

import re
from typing import Any, Final

from trio_direct.parsers.markers import first_marker
from trio_direct.parsers.tools.stream import ToolCallParser

__all__ = ["GptOssParser"]

_START: Final = "<|start|>"
_CHANNEL: Final = "<|channel|>"
_MESSAGE: Final = "<|message|>"
_TERMINATORS: Final = ("<|call|>", "<|end|>", "<|return|>")
_HEADER_STOPS: Final = (_MESSAGE, _START, *_TERMINATORS)
_RECIPIENT: Final = re.compile(r"(?:^|(?<=\s)|(?<=\|>))to=([^\s<]+)")
_MAX_HEADER: Final = 2048  # a header longer than this is not one


class GptOssParser(ToolCallParser):
    """Harmony tool calls; see the module docstring.

    Malformed: a recipient whose body is not a JSON object stays content, header included; junk
    after the arguments is skipped to the message's terminator.
    """

    format = "gpt_oss"
    requires_special_tokens = True
    MARKERS = (_START, _CHANNEL)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._name = ""

    def _on_marker(self, marker: str, at: int) -> None:
        self._begin_attempt(at, self._pos, markup=False)  # most messages are not calls
        self._state = self._header

    def _header(self) -> bool:
        buf, start = self._buf, self._mark  # the attempt began where the header does
        assert start is not None
        hit = first_marker(buf, self._pos, _HEADER_STOPS)
        if hit is None:
            if len(buf) - start > _MAX_HEADER:
                return self._fail()
            return self._starved()
        at, marker = hit
        if marker != _MESSAGE:
            return self._fail()  # a header that never opened a body: not a call
        found = _RECIPIENT.search(buf, start, at)
        if found is None:
            return self._fail()  # a message without a recipient: content
        recipient = found.group(1)
        name = recipient.removeprefix("functions.")
        if not self._valid_name(name):
            return self._fail()
        self._name = name
        self._markup_attempt = True  # a call from here: going wrong is worth reporting
        self._pos = at + len(marker)
        self._state = self._body
        return True

    def _body(self) -> bool:
        buf = self._buf
        pos = self._pos
        while pos < len(buf) and buf[pos].isspace():
            pos += 1
        if pos == len(buf):
            if self._final:  # an empty body: a call without arguments
                self._pos = pos
                self._open_call(self._name)
                self._close_call()
                self._state = self._content
                return True
            return False
        if buf[pos] not in "{[":
            if any(buf.startswith(t, pos) for t in _TERMINATORS):
                self._pos = pos
                self._open_call(self._name)
                self._state = self._after_arguments
                return True
            return self._fail()
        self._pos = pos
        self._open_call(self._name)
        self._stream_json_arguments(self._to_after_arguments)
        return True

    def _to_after_arguments(self) -> None:
        self._state = self._after_arguments

    def _after_arguments(self) -> bool:
        if not self._skip_ws():
            if self._final:  # `<|call|>` was the stop token: the call is complete
                self._close_call()
                self._state = self._content
                return True
            return False
        found = self._match(*_TERMINATORS, _START, _CHANNEL)
        if found is None:
            return self._starved()
        if not found:
            return self._fail()
        self._close_call()
        self._state = self._content
        if found in (_START, _CHANNEL):  # the next message began without a terminator
            self._on_marker(found, self._pos - len(found))
        return True

    def _recover(self) -> bool:
        self._anomaly("malformed tool call; skipped to its end")
        self._state = self._skip_to_end
        return True

    def _skip_to_end(self) -> bool:
        hit = first_marker(self._buf, self._pos, _TERMINATORS)
        if hit is None:
            self._pos = max(self._pos, len(self._buf) - max(map(len, _TERMINATORS)) + 1)
            if self._final:
                self._pos = len(self._buf)
                self._close_call()
                self._state = self._content
                return True
            return False
        self._pos = hit[0] + len(hit[1])
        self._close_call()
        self._state = self._content
        return True
