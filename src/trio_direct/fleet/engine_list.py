"""The `--engine-file` format: a list of engines, in JSON or YAML (sans-IO).

```yaml
- grpc://10.0.0.1:30001                 # a URL alone
- url: grpc://10.0.0.2:30001            # or a mapping: the URL,
  model: qwen3-8b                       # the model pool it joins (default: the name it reports)
  role: prefill                         # and the role its probe must report (default: any)
```

The list may also be the ``engines`` key of a mapping (``{"engines": [...]}``), as a ConfigMap
often holds it. JSON is YAML, so one parser reads both. Anything wrong (not a list, an unknown key,
a malformed URL, the same engine twice) is an `EngineListError` naming the entry: the watcher then
keeps the last good list, so a half-written or mistyped file never empties the fleet.
"""

from __future__ import annotations

from typing import Any

import yaml

from trio_direct.fleet.discovery import Address, EngineSpec
from trio_direct.fleet.engine_url import parse_engine_url

__all__ = ["EngineListError", "parse_engine_list", "parse_engine_spec"]

_ROLES = ("aggregated", "prefill", "decode")
_KEYS = frozenset({"url", "model", "role"})


class EngineListError(ValueError):
    """An engine list (file or admin request) that cannot be used as it is."""


def parse_engine_list(text: str) -> list[EngineSpec]:
    """The engines a file names; `EngineListError` says what is wrong and where."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise EngineListError(f"not JSON or YAML: {_one_line(error)}") from None
    if isinstance(document, dict) and set(document) == {"engines"}:
        document = document["engines"]
    if document is None:
        raise EngineListError("empty: write [] for no engines, or a list of engine URLs")
    if not isinstance(document, list):
        raise EngineListError(f'expected a list of engines (or {{"engines": [...]}}), not {type(document).__name__}')
    specs: list[EngineSpec] = []
    seen: dict[Address, int] = {}
    for position, entry in enumerate(document):
        try:
            spec = parse_engine_spec(entry)
        except EngineListError as error:
            raise EngineListError(f"entry {position}: {error}") from None
        address = spec.address
        if address in seen:
            raise EngineListError(f"entry {position}: {spec.url} is the same engine as entry {seen[address]}")
        seen[address] = position
        specs.append(spec)
    return specs


def parse_engine_spec(entry: Any) -> EngineSpec:
    """One engine: a URL string, or a mapping with ``url`` and optionally ``model`` and ``role``."""
    if isinstance(entry, str):
        entry = {"url": entry}
    if not isinstance(entry, dict):
        raise EngineListError(f"expected a URL or a mapping with a url, not {type(entry).__name__}")
    unknown = sorted(str(key) for key in entry.keys() - _KEYS)
    if unknown:
        raise EngineListError(f"unknown key(s) {', '.join(unknown)} (known: model, role, url)")
    url, model, role = entry.get("url"), entry.get("model"), entry.get("role")
    if not isinstance(url, str):
        raise EngineListError("a url (string) is required")
    try:
        parse_engine_url(url)
    except ValueError as error:
        raise EngineListError(str(error)) from None
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise EngineListError("model must be a non-empty string")
    if role is not None and role not in _ROLES:
        raise EngineListError(f"role must be one of {', '.join(_ROLES)}, not {role!r}")
    return EngineSpec(url.strip(), model.strip() if model else None, role)


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
