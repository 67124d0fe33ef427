"""The daemon's YAML config: a frozen dataclass tree, every value checked at load time.

    listen: 127.0.0.1:8000          admin: 127.0.0.1:8001 | unix:/run/tokenrouterd/admin.sock
    admin_token: "" | a secret trctl must send
    api_key_file: a file of API keys, one a line (also $TRD_API_KEY, $VLLM_API_KEY)
    api_key_metrics: false (true: /metrics wants a key too)    trd/frontend/auth.py
    ssl_certfile, ssl_keyfile: PEM files: the OpenAI endpoint speaks HTTPS
    device: auto | cpu | cuda | cuda:N            mps: auto | required | off
    memory: {budget_gib: auto | GiB, fraction: 0.9, max_kv_tokens: auto | N}
    max_model_len: N (default: the smallest context of the models)
    max_inflight: 256               stall_timeout_s: 120
    models: [{name, path, dtype, quantization, remote, prefix_cache, prefill_ahead}, ...]
                                    first = entry model
                                    quantization: none | int8 | int4 = a float checkpoint's
                                    matrices quantised at load (trd/models/quantization.py);
                                    a quantised checkpoint is served as it is stored
                                    remote: HOST:PORT = served by `tokenrouterd engine` there
                                    prefix_cache: false = this model's engine keeps no
                                    prefix cache (default: engine.prefix_cache, true)
                                    prefill_ahead: true = this model prefills each new
                                    prompt as it arrives (default: engine.prefill_ahead)
                                    draft: NAME = another model of this host whose greedy
                                    proposals this one verifies (speculative decoding in
                                    its engine: trd/engines/speculate.py)
    remote_token: a secret both hosts share (required with a remote model)
    policy: {name: rstitch, <the policy's params: trd/policies/params.py>,
             target_large_share: 0 < s < 1 (a policy with a threshold: held by the daemon)
             or request_large_share: 0 < s < 1 (held within each request without routing)
             or request_model: NAME (writes every token of a request without routing)}
    batching: {thresholds: {model: [B, ...]}, max_wait_ms: 20, auto_interval_s: 0}
    engine: {<trd/engines/spec.py EngineSettings: each key, default and check>}
    shutdown: {grace_s: 30}         restart: {max_retries: 3, backoff_s: 1.0}
    responses: {max_stored: 1024}   /v1/responses kept in memory for previous_response_id

A bad value raises ConfigError naming its key, the value and the reason; so does an
unknown key. Model paths are resolved against the config file's folder and checked to
be checkpoints that share one tokenizer (`trd/models/tokenizers.py`: same ids for the
same strings, whatever the padding of their embedding matrices).

A host reads the checkpoints of the models it runs, and no other: the daemon skips
`remote:` models (their tokenizer, vocabulary and context come over the link's handshake
and are checked there, trd/remote/card.py); `tokenrouterd engine --model NAME` reads the
same file with `serve=NAME` and reads only that model's checkpoint.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast

import yaml

from trd.config_reader import ConfigError, Section, fail
from trd.engines.spec import BatchingSettings, EngineSettings, SettingError, check_cuda_dtype
from trd.models.checkpoint import DTYPES, Checkpoint, CheckpointError, read_checkpoint
from trd.models.quantization import MODES
from trd.models.tokenizers import TOKENIZER_FILE, chat_template, first_difference, read_tokenizer
from trd.policies.pair import check_head_pair
from trd.policies.params import (
    MODEL_KEY,
    GatedParams,
    PolicyError,
    PolicySpec,
    parse_policy,
    request_model,
    request_share,
)
from trd.protocol import NO_ROUTING, RoutingParams

__all__ = ["Config", "ConfigError", "load_config"]

log = logging.getLogger(__name__)

# On CPU the KV cache is ordinary RAM that torch touches when it allocates it; without
# a cap the plan would hand a small model most of the host's memory.
CPU_MAX_KV_TOKENS = 32768
MpsMode = Literal["auto", "required", "off"]
S = TypeVar("S", EngineSettings, BatchingSettings)


class DemoModels(Protocol):
    """What `Config.demo` reads of a demo pair (`trd.demo.pair.DemoPair`, which sits above
    the config: it builds the pairs)."""

    @property
    def models(self) -> dict[str, Path]: ...

    @property
    def speculate(self) -> bool: ...

    def policy(self, large_share: float | None = None) -> dict[str, Any]: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def dtype(self) -> str: ...

    @property
    def modes(self) -> dict[str, str]: ...  # quantization by model name


@dataclass(frozen=True, slots=True)
class Address:
    """A TCP host:port, or a unix socket path (`unix:/path`) when `path` is set."""

    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.path or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_address(key: str, value: Any, allow_unix: bool, any_port: bool = False) -> Address:
    """`host:port` (port 0 with `any_port`: a free port the OS picks, which the process
    then reports), or `unix:/path` with `allow_unix`."""
    if not isinstance(value, str):
        fail(key, value, "expected 'host:port'" + (" or 'unix:/path'" if allow_unix else ""))
    if value.startswith("unix:"):
        if not allow_unix:
            fail(key, value, "a unix socket is only allowed for admin")
        path = value[len("unix:") :]
        if not os.path.isabs(path):
            fail(key, value, "the unix socket path must be absolute")
        return Address(path=path)
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    low = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) <= 65535:
        fail(key, value, f"expected 'host:port' with a port in {low}..65535"
             + (" (0: any free port)" if any_port else ""))  # fmt: skip
    return Address(host=host, port=int(port))


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    path: Path
    dtype: str
    # Read once, here; the memory plan and the engine use it. None: another host runs it.
    checkpoint: Checkpoint | None
    remote: Address | None = None  # the `tokenrouterd engine` the daemon connects to
    prefix_cache: bool | None = None  # this model's own switch; None: engine.prefix_cache
    # none | int8 | int4: how its matrices are served (a quantised checkpoint: its own mode)
    quantization: str = "none"
    prefill_ahead: bool | None = None  # likewise; None: engine.prefill_ahead
    draft: str | None = None  # the model (by name) whose proposals this one verifies

    def settings(self, engine: EngineSettings) -> EngineSettings:
        """The engine settings this model runs with: `engine:`, its own switches applied."""
        cache = engine.prefix_cache if self.prefix_cache is None else self.prefix_cache
        ahead = engine.prefill_ahead if self.prefill_ahead is None else self.prefill_ahead
        if (cache, ahead) == (engine.prefix_cache, engine.prefill_ahead):
            return engine
        return dataclasses.replace(engine, prefix_cache=cache, prefill_ahead=ahead)


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    budget_gib: float | None = None  # None = a fraction of free memory
    fraction: float = 0.9
    max_kv_tokens: int | None = None  # None = auto: CPU_MAX_KV_TOKENS on CPU, no cap on GPU


@dataclass(frozen=True, slots=True)
class Config:
    models: tuple[ModelEntry, ...]
    max_model_len: int
    listen: Address = Address("127.0.0.1", 8000)
    admin: Address = Address("127.0.0.1", 8001)
    admin_token: str = ""  # non-empty: the admin API wants `Authorization: Bearer <token>`
    remote_token: str = ""  # shared with every remote engine; proven, never sent
    api_key_file: Path | None = None  # read at start (trd/frontend/auth.py), never kept here
    api_key_metrics: bool = False
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    device: str = "auto"
    mps: MpsMode = "auto"
    memory: MemoryConfig = MemoryConfig()
    max_inflight: int = 256
    stall_timeout_s: float = 120.0  # no progress this long while an engine is silent: 504
    policy: PolicySpec = PolicySpec("rstitch")  # noqa: RUF009 - frozen, shared safely
    thresholds: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batching: BatchingSettings = BatchingSettings()  # noqa: RUF009 - frozen, shared safely
    engine: EngineSettings = EngineSettings()  # noqa: RUF009
    grace_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 1.0
    max_stored_responses: int = 1024  # /v1/responses kept; the oldest beyond are dropped

    @property
    def local(self) -> tuple[ModelEntry, ...]:
        """The models this host runs (their checkpoints were read)."""
        return tuple(m for m in self.models if m.checkpoint is not None)

    def threads(self) -> int:
        if self.engine.threads is not None:
            return self.engine.threads
        return max(1, (os.cpu_count() or 1) // len(self.local))

    def threads_alone(self) -> int:
        """CPU threads while the host's other engines are idle (a one-request stretch)."""
        if self.engine.threads_alone is not None:
            return self.engine.threads_alone
        if self.engine.threads is not None:
            return self.threads()
        return max(self.threads(), os.cpu_count() or 1)

    @classmethod
    def demo(cls, pair: DemoModels, port: int, large_share: float | None = None) -> Config:
        """The `--demo` setup: the pair with its policy (`DemoPair.policy`: with
        `large_share`, the share control holds the large model's share) on CPU, admin on
        port + 1 (port 0: both on free ports the OS picks)."""
        raw = {
            "listen": f"127.0.0.1:{port}",
            "admin": f"127.0.0.1:{port + 1 if port else 0}",
            "device": "cpu",
            "mps": "off",
            "memory": {"max_kv_tokens": 16384},
            "max_model_len": pair.max_model_len,
            "models": [
                {
                    "name": name,
                    "path": str(pair.models[name]),
                    "dtype": pair.dtype,
                    "quantization": pair.modes[name],
                    **({"draft": "small"} if name == "large" and pair.speculate else {}),
                }
                for name in ("small", "large")
            ],
            "policy": pair.policy(large_share),
            "shutdown": {"grace_s": 5},
        }
        return from_dict(raw, Path.cwd())


def load_config(path: Path, serve: str | None = None) -> Config:
    """Read and validate the YAML config at `path` (`serve`: see `from_dict`)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return from_dict(raw, path.parent, serve)


def from_dict(raw: Any, base_dir: Path, serve: str | None = None) -> Config:
    """Validate a parsed config; relative model paths are taken from `base_dir`.

    `serve`: the one model a remote engine host runs (`tokenrouterd engine --model`);
    None: the daemon's view, every model but the `remote:` ones runs here."""
    top = Section("config", raw)
    models = _models(top.list("models"), base_dir, serve)
    policy = Section("policy", top.get("policy", {"name": "rstitch"}))
    batching = Section("batching", top.get("batching", {}))
    shutdown = Section("shutdown", top.get("shutdown", {}))
    restart = Section("restart", top.get("restart", {}))
    responses = Section("responses", top.get("responses", {}))
    max_inflight = top.integer("max_inflight", 256, low=1)
    cfg = Config(
        models=models,
        max_model_len=_max_model_len(top, models),
        listen=parse_address("listen", top.get("listen", "127.0.0.1:8000"), False, any_port=True),
        admin=_admin(top.get("admin", "127.0.0.1:8001")),
        admin_token=_token("admin_token", top.get("admin_token", "")),
        remote_token=_remote_token(top, models, serve),
        api_key_file=_file(top, "api_key_file", base_dir),
        api_key_metrics=top.boolean("api_key_metrics", False),
        ssl_certfile=_file(top, "ssl_certfile", base_dir),
        ssl_keyfile=_file(top, "ssl_keyfile", base_dir),
        device=_device(top.get("device", "auto")),
        mps=_mps(top.get("mps", "auto")),
        memory=_memory(Section("memory", top.get("memory", {}))),
        max_inflight=max_inflight,
        stall_timeout_s=top.number("stall_timeout_s", 120.0, low=1.0),
        policy=_policy(policy, models),
        thresholds=_thresholds(
            batching.get("thresholds", {}), [m.name for m in models], max_inflight
        ),
        batching=_settings(BatchingSettings, batching),
        engine=_settings(EngineSettings, Section("engine", top.get("engine", {}))),
        grace_s=shutdown.number("grace_s", 30.0, low=0.0),
        max_retries=restart.integer("max_retries", 3, low=0),
        backoff_s=restart.number("backoff_s", 1.0, low=0.0),
        max_stored_responses=responses.integer("max_stored", 1024, low=0),
    )
    for sec in (top, shutdown, restart, responses):
        sec.done()
    for i, m in enumerate(models):
        try:
            m.settings(cfg.engine)
        except SettingError as exc:
            raise ConfigError(f"models[{i}] ({m.name}): {exc}") from None
    if cfg.device.startswith("cuda"):  # with device: auto the deployment checks this
        for i, m in enumerate(models):
            try:
                check_cuda_dtype(f"models[{i}].dtype", m.dtype, cfg.engine.attention)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
    return cfg


def _admin(value: Any) -> Address:
    addr = parse_address("admin", value, allow_unix=True, any_port=True)
    if not addr.is_loopback:
        fail("admin", value, "the admin API must listen on loopback or a unix socket")
    return addr


def _device(value: Any) -> str:
    ok = isinstance(value, str) and (
        value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())
    )
    if not ok:
        fail("device", value, "expected auto, cpu, cuda or cuda:N")
    return str(value)


def _memory(sec: Section) -> MemoryConfig:
    budget = sec.get("budget_gib", "auto")
    if budget != "auto" and (
        isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0
    ):
        fail("memory.budget_gib", budget, "expected auto or a positive number of GiB")
    fraction = sec.number("fraction", 0.9, low=0.0, high=1.0)
    if fraction == 0:
        fail("memory.fraction", fraction, "must be in (0, 1]")
    kv = sec.get("max_kv_tokens", "auto")
    if kv != "auto" and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
        fail("memory.max_kv_tokens", kv, "expected auto or a positive integer")
    sec.done()
    return MemoryConfig(
        None if budget == "auto" else float(budget), fraction, None if kv == "auto" else kv
    )


def _settings(cls: type[S], sec: Section) -> S:
    """A settings section: its keys, defaults and checks are the dataclass's fields."""
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        value = sec.get(f.name, f.default)
        values[f.name] = None if value == "auto" and f.metadata.get("auto") else value
    sec.done()
    try:
        return cls(**values)
    except SettingError as exc:
        raise ConfigError(str(exc)) from None


def _policy(sec: Section, models: tuple[ModelEntry, ...]) -> PolicySpec:
    name = sec.string("name", "rstitch")
    params = sec.rest()
    try:
        parsed = parse_policy(name, params, len(models))
        pin = request_model(PolicySpec(name, params))
        if pin is not None and pin not in [m.name for m in models]:
            served = [m.name for m in models]
            raise PolicyError(f"policy.{MODEL_KEY}: {pin!r}: not a served model ({served})")
        # A trained head names its pair; another pair's head is refused here, at start.
        small, large = models[0], models[-1]
        if isinstance(parsed, GatedParams) and small.checkpoint and large.checkpoint:
            check_head_pair(Path(parsed.head), small.path, large.path)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return PolicySpec(name, params)


def _mps(value: Any) -> MpsMode:
    # YAML reads a bare `off` as false; `on` / `true` are ambiguous between auto and required.
    if value is False:
        return "off"
    if value not in ("auto", "required", "off"):
        fail("mps", value, "expected auto, required or off")
    return cast(MpsMode, value)


def _token(key: str, value: Any) -> str:
    if not isinstance(value, str) or (value and (len(value) < 16 or not value.isprintable())):
        fail(key, "<hidden>", "expected a printable string of at least 16 characters")
    return value


def _file(top: Section, key: str, base_dir: Path) -> Path | None:
    """An optional file's path, taken from the config's folder; read where it is used."""
    value = top.get(key, None)
    return None if value is None else base_dir / Path(top.string(key)).expanduser()


def _remote_token(top: Section, models: tuple[ModelEntry, ...], serve: str | None) -> str:
    token = _token("remote_token", top.get("remote_token", ""))
    remote = [m.name for m in models if m.remote is not None and m.checkpoint is None]
    if not token and (remote or serve is not None):
        why = f"model {remote[0]!r} is remote" if remote else f"this host serves {serve!r}"
        raise ConfigError(f"remote_token: missing: {why}, and the link needs a shared token")
    return token


def _models(items: list[Any], base_dir: Path, serve: str | None) -> tuple[ModelEntry, ...]:
    if not items:
        fail("models", items, "at least one model is needed")
    entries: list[ModelEntry] = []
    for i, item in enumerate(items):
        sec = Section(f"models[{i}]", item)
        name = sec.string("name")
        if name in [e.name for e in entries]:
            fail(f"models[{i}].name", name, "duplicate model name")
        path = base_dir / Path(sec.string("path")).expanduser()
        dtype = sec.choice("dtype", list(DTYPES), "bfloat16")
        quantization = sec.choice("quantization", list(MODES), "none")
        raw_remote = sec.get("remote", None)
        remote = (
            None
            if raw_remote is None
            else parse_address(f"models[{i}].remote", raw_remote, allow_unix=False)
        )
        switches = {
            key: None if sec.get(key, None) is None else sec.boolean(key)
            for key in ("prefix_cache", "prefill_ahead")
        }
        draft = None if sec.get("draft", None) is None else sec.string("draft")
        sec.done()
        if i == 0 and remote is not None:
            fail("models[0].remote", raw_remote, "the entry model runs with the daemon: the "
                 "front end encodes prompts with its tokenizer")  # fmt: skip
        ckpt = None
        if (serve is None and remote is None) or serve == name:
            try:
                ckpt = read_checkpoint(path)
            except CheckpointError as exc:
                fail(f"models[{i}].path", str(path), f"not a servable checkpoint: {exc}")
            quantization = _quantization(i, quantization, ckpt, item)
        entries.append(ModelEntry(name, path, dtype, ckpt, remote, quantization=quantization,
                                  draft=draft, **switches))  # fmt: skip
    _check_drafts(entries)
    if serve is not None:
        if serve not in [e.name for e in entries]:
            names = [e.name for e in entries]
            raise ConfigError(f"--model: {serve!r}: no such model in the config (models: {names})")
        return tuple(entries)  # the daemon checks the tokenizer when it connects
    if not (entries[0].path / TOKENIZER_FILE).is_file():
        fail("models[0].path", str(entries[0].path), "the entry model has no tokenizer.json")
    _check_one_tokenizer(entries)
    return tuple(entries)


def _check_drafts(entries: list[ModelEntry]) -> None:
    """A draft is another model of this config, and both run on this host (the draft is
    loaded into the verifying model's engine process; one tokenizer: checked for all)."""
    names = [e.name for e in entries]
    for i, e in enumerate(entries):
        if e.draft is None:
            continue
        if e.draft == e.name or e.draft not in names:
            others = [n for n in names if n != e.name]
            fail(f"models[{i}].draft", e.draft, f"another model of this config ({others})")
        if e.remote is not None or entries[names.index(e.draft)].remote is not None:
            fail(f"models[{i}].draft", e.draft, "both models run on this host (the draft is "
                 "loaded into this model's engine)")  # fmt: skip


def default_routing(cfg: Config) -> RoutingParams:
    """What a request without `routing` gets: policy.request_model's model for every token,
    policy.request_large_share's share, or the daemon's policy (NO_ROUTING)."""
    share, pin = request_share(cfg.policy), request_model(cfg.policy)
    if pin is not None:
        return RoutingParams(model=[m.name for m in cfg.models].index(pin))
    return NO_ROUTING if share is None else RoutingParams(large_share=share)


def draft_of(cfg: Config, entry: ModelEntry) -> ModelEntry | None:
    """The model whose proposals `entry` verifies (its `draft`), if any."""
    return next((m for m in cfg.models if m.name == entry.draft), None)


def _quantization(i: int, mode: str, ckpt: Checkpoint, item: dict[str, Any]) -> str:
    """A quantised checkpoint is served as stored: a different mode asked for is refused."""
    if ckpt.quantization == "none":
        return mode
    if "quantization" in item and mode != ckpt.quantization:
        fail(f"models[{i}].quantization", mode, f"the checkpoint {ckpt.path} is quantised "
             f"({ckpt.quantization}): serve it so, or serve a float checkpoint")  # fmt: skip
    return ckpt.quantization


def _check_one_tokenizer(entries: list[ModelEntry]) -> None:
    """Routed models exchange token ids: each must read them as the entry model does.

    Remote models are checked the same way when the daemon connects (trd/remote/card.py)."""
    if len(entries) == 1:
        return
    entry = entries[0]
    first = read_tokenizer(entry.path)
    assert first is not None
    for i, e in enumerate(entries[1:], start=1):
        if e.checkpoint is None:
            continue
        try:
            other = read_tokenizer(e.path)
        except CheckpointError as exc:
            fail(f"models[{i}].path", str(e.path), str(exc))
        if other is None:
            reason = f"no tokenizer.json: cannot check that it shares {entry.name}'s tokenizer"
            fail(f"models[{i}].path", str(e.path), reason)
        difference = first_difference(first, other, entry.name, e.name)
        if difference:
            fail(f"models[{i}].path", str(e.path),
                 f"its tokenizer differs from {entry.name}'s: {difference};"
                 " routed models must share one tokenizer")  # fmt: skip
        if chat_template(e.path) != chat_template(entry.path):
            log.warning("models[%d] (%s): its chat template differs from %s's; %s's is used "
                        "for every model", i, e.name, entry.name, entry.name)  # fmt: skip


def _max_model_len(top: Section, models: tuple[ModelEntry, ...]) -> int:
    """At most the smallest context here; a remote engine's is checked when it connects."""
    context = min(m.checkpoint.config.context for m in models if m.checkpoint is not None)
    value = top.integer("max_model_len", context, low=2)
    if value > context:
        fail("max_model_len", value, f"exceeds the models' smallest context ({context})")
    return value


def _thresholds(raw: Any, names: list[str], max_inflight: int) -> dict[str, tuple[int, ...]]:
    sec = Section("batching.thresholds", raw)
    out = {}
    for name in list(sec.keys()):
        if name not in names:
            fail(f"batching.thresholds.{name}", raw[name], f"no such model (models: {names})")
        out[name] = parse_thresholds(f"batching.thresholds.{name}", sec.get(name), max_inflight)
    return out


def parse_thresholds(key: str, value: Any, max_inflight: int) -> tuple[int, ...]:
    """Batch thresholds B indexed by active-request count: 1 <= B <= max_inflight each.

    More entries than max_inflight could never be indexed, and a B above it never met.
    """

    def good(b: Any) -> bool:
        return isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= max_inflight

    ok = isinstance(value, list) and 0 < len(value) <= max_inflight and all(map(good, value))
    if not ok:
        fail(key, value, f"expected 1 to {max_inflight} integers, each in [1, {max_inflight}]"
             " (max_inflight)")  # fmt: skip
    return tuple(value)
