"""`--served-model-name` and `--model-path` per model pool (sans-IO).

Engines are grouped into pools by the model name clients use. Both flags take a plain value or
``NAME=VALUE`` entries, repeatable:

- ``--served-model-name NAME``: one pool, called NAME, that every engine joins whatever it reports
  (as with a single model before); ``--served-model-name REPORTED=NAME``: engines reporting
  REPORTED (or named REPORTED by their source) are served as NAME. The two forms do not mix.
- ``--model-path PATH``: the tokenizer directory of the only pool (a second model is refused: its
  tokenizer would be wrong); ``--model-path NAME=PATH``: the tokenizer directory of pool NAME (the
  name clients use). Pools without an entry load the tokenizer path their engines report.

A value is split at its first ``=``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from trio_direct.fleet.fleet import FleetError, FleetOverrides

__all__ = ["PoolSettings"]


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """What each served model's pool is called and where its tokenizer is."""

    #: The plain ``--served-model-name``: a single pool with this name.
    served_model_name: str | None = None
    #: ``REPORTED=NAME`` entries.
    renames: Mapping[str, str] = field(default_factory=dict)
    #: The plain ``--model-path``: the tokenizer of the only pool.
    model_path: str | None = None
    #: ``NAME=PATH`` entries, by the name clients use.
    model_paths: Mapping[str, str] = field(default_factory=dict)
    #: ``--kv-cache-block-size``, for every pool.
    kv_cache_block_size: int | None = None

    @classmethod
    def parse(
        cls, served_model_name: Sequence[str], model_path: Sequence[str], kv_cache_block_size: int | None = None
    ) -> PoolSettings:
        """The settings the flags give; `ValueError` naming the flag for a contradiction."""
        plain_names, renames = _split("--served-model-name", served_model_name)
        if plain_names and renames:
            raise ValueError(
                "--served-model-name: give either one NAME (a single pool) or REPORTED=NAME entries, not both"
            )
        plain_paths, paths = _split("--model-path", model_path)
        if plain_paths and paths:
            raise ValueError("--model-path: give either one PATH (a single pool) or NAME=PATH entries, not both")
        for flag, plain in (("--served-model-name", plain_names), ("--model-path", plain_paths)):
            if len(plain) > 1:
                raise ValueError(f"{flag} is given {len(plain)} plain values; with several models use NAME=VALUE")
        return cls(
            served_model_name=plain_names[0] if plain_names else None,
            renames=renames,
            model_path=plain_paths[0] if plain_paths else None,
            model_paths=paths,
            kv_cache_block_size=kv_cache_block_size,
        )

    def pool_name(self, reported: str) -> str:
        """The pool (model name clients use) of an engine reporting, or named by its source, `reported`."""
        if self.served_model_name is not None:
            return self.served_model_name
        return self.renames.get(reported, reported)

    def overrides(self, pool: str, other_pools: Collection[str] = ()) -> FleetOverrides:
        """The fleet overrides of `pool`; `FleetError` when a plain ``--model-path`` would give a
        second model the first one's tokenizer."""
        path = self.model_paths.get(pool)
        if path is None and self.model_path is not None:
            others = sorted(name for name in other_pools if name != pool)
            if others:
                raise FleetError(
                    f"--model-path {self.model_path} is the tokenizer of model {others[0]!r}; "
                    f"with several models give --model-path NAME=PATH for each (here {pool}=...)"
                )
            path = self.model_path
        return FleetOverrides(path, pool, self.kv_cache_block_size)


def _split(flag: str, values: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    plain: list[str] = []
    named: dict[str, str] = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep:
            plain.append(value)
            continue
        if not name or not setting:
            raise ValueError(f"{flag} {value!r}: write NAME=VALUE")
        if name in named and named[name] != setting:
            raise ValueError(f"{flag}: {name} is given twice ({named[name]!r}, {setting!r})")
        named[name] = setting
    return plain, named
