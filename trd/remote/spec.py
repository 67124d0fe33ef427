"""What the daemon knows of a model another host runs: where it is, and what it must be.

The daemon never reads a remote model's checkpoint. Its tokenizer, context and KV pages
come in the model card at each connection (trd/remote/card.py) and are checked against
what this side expects, which is written here from the daemon's config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trd.config import Address
from trd.engines.spec import BatchingSettings, EngineSettings
from trd.policies.params import PolicySpec


@dataclass(frozen=True, slots=True)
class RemoteSpec:
    index: int
    name: str
    address: Address
    token: str = field(repr=False)  # never in a log line
    model_names: tuple[str, ...]  # the config's models, in order: both sides must agree
    max_model_len: int  # the remote engine must serve sequences this long
    entry_dir: Path  # the entry model's folder: the remote's tokenizer must equal its
    dtype: str  # what the config asks; the remote engine reports what it runs
    policy: PolicySpec
    settings: EngineSettings
    thresholds: tuple[int, ...] = (1,)
    batching: BatchingSettings = BatchingSettings()  # noqa: RUF009 - frozen, shared safely
    kv_pages: int = 0  # unknown here: the remote host plans its own memory

    @property
    def num_models(self) -> int:
        return len(self.model_names)

    def describe(self) -> str:
        return f"remote engine {self.name!r} at {self.address}"
