"""Where a model's tokenizer files are on this host: a local folder, or the Hugging Face cache.

SGLang users name a model by its Hugging Face id (``--model-path Qwen/Qwen3-8B``), and the engine
reports that id as its model and tokenizer path. The frontend's host rarely has a folder at that
path, but it often has the model in its Hugging Face cache (the same volume the engine reads), or
it may download the tokenizer files (a few MB; never the weights). `find_model_directory` resolves
a reference in that order. The engine itself is the third source (`fleet/tokenizer_source.py`).

The Hugging Face settings are read from the environment at each call, as ``huggingface_hub``
defines them: ``HF_HUB_CACHE`` (else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``),
``HF_HUB_OFFLINE`` (cache only, no download) and ``HF_TOKEN`` (gated models). Blocking: run it in a
worker thread.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "TOKENIZER_FILE_PATTERNS",
    "HubSettings",
    "ModelDirectory",
    "ModelFilesNotFound",
    "find_model_directory",
    "looks_like_model_id",
]

#: The files the frontend reads from a model folder: tokenizer, its configs and chat templates
#: (never the weights).
TOKENIZER_FILE_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
)
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_TRUE = ("1", "true", "yes", "on")


class ModelFilesNotFound(LookupError):
    """Neither a local folder nor the Hugging Face cache (or Hub) has the model's tokenizer."""


@dataclass(frozen=True, slots=True)
class ModelDirectory:
    """A folder holding a model's tokenizer files, and where it came from (for the log line)."""

    path: Path
    source: str


@dataclass(frozen=True, slots=True)
class HubSettings:
    """The Hugging Face cache and download settings the environment gives."""

    cache_dir: Path
    offline: bool
    token: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> HubSettings:
        env = os.environ if environ is None else environ
        home = Path(env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
        cache = Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else home / "hub"
        offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
        return cls(cache.expanduser(), offline, env.get("HF_TOKEN") or None)


def looks_like_model_id(reference: str) -> bool:
    """``ORG/NAME`` or ``NAME``, as the Hub spells ids (not a path: no leading ``/``, ``.`` or ``~``)."""
    return bool(_MODEL_ID.match(reference)) and ".." not in reference


def find_model_directory(
    reference: str, *, environ: Mapping[str, str] | None = None, download: bool = True
) -> ModelDirectory:
    """The folder with `reference`'s tokenizer files: `reference` itself when it is a local folder,
    else the Hugging Face cache's snapshot of the model id, else (online, `download`, and not
    ``HF_HUB_OFFLINE``) the tokenizer files downloaded into that cache.

    Raises `ModelFilesNotFound` with the reason each place gave."""
    local = Path(reference).expanduser()
    if local.is_dir():
        return ModelDirectory(local, "local folder")
    if not looks_like_model_id(reference):
        raise ModelFilesNotFound(f"{reference} is not a folder on this host")
    settings = HubSettings.from_environ(environ)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(
            reference, cache_dir=settings.cache_dir, local_files_only=True, allow_patterns=list(TOKENIZER_FILE_PATTERNS)
        )
        if (Path(path) / "tokenizer.json").is_file():
            return ModelDirectory(Path(path), f"Hugging Face cache {settings.cache_dir}")
        cached = f"the Hugging Face cache {settings.cache_dir} has {reference} without tokenizer.json"
    except (LocalEntryNotFoundError, OSError, ValueError):
        cached = f"{reference} is not in the Hugging Face cache {settings.cache_dir}"
    if settings.offline or not download:
        why = "HF_HUB_OFFLINE is set" if settings.offline else "downloads are off"
        raise ModelFilesNotFound(f"{cached}, and {why}")
    try:
        path = snapshot_download(
            reference,
            cache_dir=settings.cache_dir,
            allow_patterns=list(TOKENIZER_FILE_PATTERNS),
            token=settings.token,
            etag_timeout=10,
        )
    except Exception as error:  # noqa: BLE001 - any Hub or network failure is one reason among the sources'
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelFilesNotFound(f"{cached}, and downloading it failed: {first_line}") from None
    if not (Path(path) / "tokenizer.json").is_file():
        raise ModelFilesNotFound(f"{cached}, and the Hub's {reference} has no tokenizer.json")
    return ModelDirectory(Path(path), f"downloaded from the Hugging Face Hub into {settings.cache_dir}")
