"""Engine output token ids to text, incrementally, one stream per request choice.

Clients must never see half a character: a UTF-8 sequence split across tokens (CJK, emoji,
byte-fallback) is held back until its last byte arrives. `tokenizers.decoders.DecodeStream`
does this in Rust at well under a microsecond per token; this wrapper adds what it lacks: the
end-of-stream flush (DecodeStream keeps a trailing incomplete sequence forever, where
`decode(all_ids)` would show U+FFFD), list input, and a prompt context that cannot break it.

Guarantee (property-tested): for any split of `ids` into `push` calls,
`"".join(pushes) + flush() == tokenizer.decode(ids, skip_special_tokens)` for byte-level BPE
tokenizers (GPT-2 style: Qwen, Llama 3, DeepSeek) on any ids, and for SentencePiece-style
byte-fallback tokenizers (Llama 2, Mistral) on valid UTF-8 output. On invalid bytes the latter
decode non-monotonically (a later byte token turns an earlier, already-streamed character into
U+FFFD), which no stream can mirror without retracting text; DecodeStream then raises, and this
wrapper continues with the same windowed algorithm in Python, best effort, instead of failing
the request.

For byte-level tokenizers (the decoder is `ByteLevel` alone) the same algorithm runs in Python on
bytes, ~4x cheaper per token than a `DecodeStream.step` call (which decodes its whole window
twice through the binding): each streamed token would otherwise spend ~1.5 µs in it. The bytes
per id come from `text.byte_level`, which vouches, checked at load, that their UTF-8 decoding is
`decode`'s. The steps below make the same choices `DecodeStream` makes, so every `push` returns
what the `DecodeStream` path returns (tested on any split of any ids).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers.decoders import DecodeStream

from trio_direct.text.byte_level import byte_level_pieces
from trio_direct.text.tokenizer import ModelTokenizer

__all__ = ["IncrementalDetokenizer"]

# Prompt ids kept as decoding context: enough for decoders whose output depends on the
# previous token (SentencePiece's leading space), cheap to decode once.
_PROMPT_CONTEXT = 4
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Stateful per-stream detokenizer; create one per request choice, never share it.

    `spaces_between_special_tokens` is accepted for API parity with SGLang's sampling
    parameters; like HF fast tokenizers (and SGLang with them), decoding ignores it.
    """

    __slots__ = (
        "_tokenizer", "_skip", "_stream", "_chunk", "_pending", "_prefix", "_done", "_prepared", "_pieces",
        "_chunk_bytes", "_pending_bytes", "_clean",
    )  # fmt: skip

    def __init__(
        self,
        tokenizer: ModelTokenizer,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        prompt_ids: Sequence[int] | None = None,
        *,
        byte_level: bool = True,
    ) -> None:
        self._tokenizer = tokenizer.tokenizer
        self._skip = skip_special_tokens
        # Mirrors DecodeStream's window: the ids of the last emitted chunk (its decoding
        # context; the prompt's last ids to begin with) and the ids pushed since, which have not
        # produced text yet.
        self._chunk: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        self._pending: list[int] = []
        # None until `prepare`, and again once DecodeStream has given up (see the module docstring).
        self._stream: DecodeStream | None = None
        self._prefix = ""  # decode(self._chunk), kept only without DecodeStream
        self._done = False
        self._prepared = False
        # Byte-level tokenizers: the bytes per id, and the window's bytes (`_push_bytes`).
        # False: DecodeStream for any tokenizer (the reference the byte-level path is tested against).
        self._pieces = byte_level_pieces(self._tokenizer) if byte_level else None
        self._chunk_bytes = b""
        self._pending_bytes = b""
        self._clean = True  # the chunk's bytes are valid UTF-8 (`_push_bytes`)

    def prepare(self) -> None:
        """Open the decoding stream (done by the first `push` otherwise; idempotent).

        Separate from construction so that a request pays for it after its engine call has left,
        while the engine computes the first token, not before.
        """
        if self._prepared:
            return
        self._prepared = True
        # A prompt ending inside a UTF-8 sequence would make DecodeStream's prefix end in
        # U+FFFD and every later step fail its prefix check; decode without context then.
        if self._chunk and self._decode(self._chunk).endswith(_REPLACEMENT):
            self._chunk = []
        pieces = self._pieces
        if pieces is not None:
            self._chunk_bytes = pieces.bytes_of(self._chunk, self._skip)
            self._prefix = self._chunk_bytes.decode("utf-8", "replace")
            self._clean = _REPLACEMENT not in self._prefix
            return
        self._stream = DecodeStream(ids=self._chunk or None, skip_special_tokens=self._skip)

    def push(self, token_ids: Sequence[int]) -> str:
        """Append engine output ids; return the text they complete (possibly "")."""
        if self._done:
            raise RuntimeError("push() after flush()")
        if not self._prepared:
            self.prepare()
        if self._pieces is not None:
            return self._push_bytes(token_ids)
        if self._stream is None:
            return "".join(self._step_in_python(token_id) for token_id in token_ids)
        step = self._stream.step
        tokenizer = self._tokenizer
        pending = self._pending
        text = ""  # per token, a concatenation costs less than a list and its join
        for index, token_id in enumerate(token_ids):
            pending.append(token_id)
            try:
                piece = step(tokenizer, token_id)
            except Exception:  # noqa: BLE001 - DecodeStream's "invalid prefix": see the module docstring
                self._pending = pending[:-1]
                self._stream = None
                self._prefix = self._decode(self._chunk)
                return text + "".join([self._step_in_python(i) for i in token_ids[index:]])
            if piece is not None:
                text += piece
                self._chunk = pending
                pending = []
        self._pending = pending
        return text

    def _push_bytes(self, token_ids: Sequence[int]) -> str:
        """`push` for byte-level tokenizers: `DecodeStream.step`'s choices, per id, on the window's
        bytes (the last emitted chunk's, then those pushed since; `_prefix` is the chunk's text).

        Most tokens are whole characters: with a chunk of valid UTF-8, nothing held back and a
        token valid alone, the window's text is the chunk's then the token's, and the token's text
        is what comes out, without decoding anything.
        """
        pieces = self._pieces
        assert pieces is not None
        skip = self._skip
        table = pieces.skipped if skip else pieces.shown
        pending = self._pending
        chunk_bytes, pending_bytes, prefix, clean = self._chunk_bytes, self._pending_bytes, self._prefix, self._clean
        text = ""
        for index, token_id in enumerate(token_ids):
            pending.append(token_id)
            data, piece = table.get(token_id) or pieces.piece(token_id, skip)
            if piece is not None and clean and not pending_bytes:
                if not piece:
                    continue  # no bytes: nothing new
                if piece[-1] != _REPLACEMENT:
                    text += piece
                    self._chunk = pending
                    pending = []
                    chunk_bytes, prefix = data, piece
                    continue
            pending_bytes += data
            window = (chunk_bytes + pending_bytes).decode("utf-8", "replace")
            if window.startswith(prefix):
                if len(window) <= len(prefix) or window[-1] == _REPLACEMENT:
                    continue  # nothing new yet, or a character still incomplete: held back
            elif len(window.encode()) > len(prefix.encode()) and window[-1] != _REPLACEMENT:
                # Where DecodeStream reports an invalid prefix (its lengths are in UTF-8 bytes),
                # continue as the DecodeStream path does.
                self._pieces = None
                self._pending = pending[:-1]
                self._prefix = prefix
                return text + "".join([self._step_in_python(i) for i in token_ids[index:]])
            else:
                continue
            text += window[len(prefix) :]
            self._chunk = pending
            pending = []
            chunk_bytes, pending_bytes = pending_bytes, b""
            prefix = chunk_bytes.decode("utf-8", "replace")
            clean = _REPLACEMENT not in prefix
        self._pending = pending
        self._chunk_bytes, self._pending_bytes, self._prefix, self._clean = chunk_bytes, pending_bytes, prefix, clean
        return text

    def flush(self) -> str:
        """End of stream: release held-back ids, with U+FFFD for bytes that never completed."""
        self._done = True
        if not self._pending:
            return ""
        pending, self._pending = self._pending, []
        before = self._decode(self._chunk)
        text = self._decode(self._chunk + pending)
        return text[len(before) :] if text.startswith(before) else self._decode(pending)

    def _step_in_python(self, token_id: int) -> str:
        """DecodeStream's step, tolerating a window whose text no longer starts with its prefix."""
        self._pending.append(token_id)
        text = self._decode(self._chunk + self._pending)
        if len(text) <= len(self._prefix) or text.endswith(_REPLACEMENT):
            return ""
        piece = text[len(self._prefix) :]
        self._chunk, self._pending = self._pending, []
        self._prefix = self._decode(self._chunk)
        return piece

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""
