"""Where a served model's tokenizer comes from, tried in the order users expect.

1. ``--model-path``/``--tokenizer-path``, or the path the engines report, when it is a folder here.
2. The Hugging Face cache for a model id (what SGLang's ``--model-path ORG/NAME`` reports), or the
   Hub itself when the host is online and ``HF_HUB_OFFLINE`` is not set (`text.model_source`).
3. The engine: the SMG API's `GetTokenizer` streams the engine's tokenizer folder as a ZIP archive,
   kept in a folder named by its SHA-256 under the system's temporary directory. The native API has
   no such RPC: it offers `Tokenize`/`Detokenize` per text only, and the frontend needs the files
   themselves (chat template, special tokens, incremental detokenization).

One log line says which source served; when none did, one error names the three ways to give one.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path, PurePosixPath

import trio

from trio_direct.engine.errors import EngineError
from trio_direct.text.model_source import ModelFilesNotFound, find_model_directory
from trio_direct.text.tokenizer import ModelTokenizer

__all__ = ["HOW_TO_GIVE_ONE", "TokenizerNotFound", "TokenizerSource", "extract_tokenizer_archive", "locate_tokenizer"]

log = logging.getLogger(__name__)

#: Largest tokenizer archive taken from an engine, and largest it may unpack to.
MAX_ARCHIVE_BYTES = 256 * 1024 * 1024
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
ENGINE_TOKENIZER_DIR = "trio-direct-engine-tokenizers"

HOW_TO_GIVE_ONE = (
    "give it one of three ways: --model-path DIR (a local folder with tokenizer.json), the model id in "
    "the Hugging Face cache (HF_HOME or HF_HUB_CACHE; online without HF_HUB_OFFLINE it downloads), or an "
    "engine that serves GetTokenizer: SGLang on the SMG API (--smg-grpc-mode) or vLLM with smg-grpc-servicer"
)


class TokenizerNotFound(LookupError):
    """No source had the model's tokenizer: the message lists what each said, then the three ways."""


@dataclass(frozen=True, slots=True)
class TokenizerSource:
    """A loaded tokenizer, the folder it was read from and how that folder was found."""

    tokenizer: ModelTokenizer
    directory: Path
    description: str


async def locate_tokenizer(model_name: str, reference: str, engines: Sequence[object]) -> TokenizerSource:
    """The tokenizer of `model_name`, whose engines report (or ``--model-path`` gives) `reference`.

    `engines`: the pool's first `fleet.Engine`s, asked in order when the first two sources fail.
    Raises `TokenizerNotFound`; a folder that is found but holds a broken tokenizer raises
    `TokenizerLoadError` (another source would not mend it)."""
    reasons: list[str] = []
    try:
        found = await trio.to_thread.run_sync(find_model_directory, reference)
    except ModelFilesNotFound as error:
        reasons.append(str(error))
    else:
        if (found.path / "tokenizer.json").is_file():
            return await _load(model_name, found.path, f"{found.source} {found.path}")
        reasons.append(f"{found.path} has no tokenizer.json")
    for engine in engines:
        client = getattr(engine, "client", None)
        fetch = getattr(client, "tokenizer_archive", None)
        name = getattr(engine, "id", "?")
        if fetch is None:
            api = getattr(client, "api", "?")
            reasons.append(
                f"engine {name} speaks the {api} API, which has no RPC returning the tokenizer's files "
                "(only Tokenize/Detokenize per text)"
            )
            continue
        try:
            data, digest = await fetch(max_bytes=MAX_ARCHIVE_BYTES)
            directory = await trio.to_thread.run_sync(extract_tokenizer_archive, data, digest)
        except (EngineError, ValueError, OSError, zipfile.BadZipFile) as error:
            reasons.append(f"engine {name}'s GetTokenizer failed: {error}")
            continue
        return await _load(model_name, directory, f"engine {name} (GetTokenizer), unpacked in {directory}")
    raise TokenizerNotFound(f"model {model_name!r} has no tokenizer: {'; '.join(reasons)}. {HOW_TO_GIVE_ONE}")


async def _load(model_name: str, directory: Path, description: str) -> TokenizerSource:
    tokenizer = await trio.to_thread.run_sync(ModelTokenizer.from_directory, directory)
    log.info("model %r: tokenizer from %s", model_name, description)
    return TokenizerSource(tokenizer, directory, description)


def extract_tokenizer_archive(data: bytes, digest: str, root: Path | None = None) -> Path:
    """Unpack an engine's tokenizer ZIP into a folder named by its SHA-256 (reused when present).

    `ValueError` when the digest the engine gave does not match, a member would land outside the
    folder, or the archive unpacks to more than `MAX_UNPACKED_BYTES`."""
    actual = hashlib.sha256(data).hexdigest()
    if digest and digest.lower() != actual:
        raise ValueError(f"the archive's SHA-256 is {actual}, the engine said {digest}")
    base = (root or Path(tempfile.gettempdir())) / ENGINE_TOKENIZER_DIR
    target = base / actual
    if (target / "tokenizer.json").is_file():
        return target
    with zipfile.ZipFile(BytesIO(data)) as archive:
        members = archive.infolist()
        if sum(member.file_size for member in members) > MAX_UNPACKED_BYTES:
            raise ValueError(f"the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")
        for member in members:
            parts = PurePosixPath(member.filename).parts
            if member.filename.startswith("/") or ".." in parts or "\\" in member.filename:
                raise ValueError(f"the archive names a file outside its folder: {member.filename!r}")
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{actual[:12]}-", dir=base))
        try:
            archive.extractall(staging)
            if not (staging / "tokenizer.json").is_file():
                raise ValueError("the archive has no tokenizer.json")
            try:
                staging.rename(target)
            except OSError:  # another process unpacked the same archive first: use its folder
                if not (target / "tokenizer.json").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # gone already when renamed
    return target
