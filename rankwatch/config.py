"""The TOML configuration of ``rankwatch run`` (docs/kafka.md has the full reference).

Every problem is one :class:`rankwatch.errors.ConfigError` line naming the key, e.g.
``config.toml: windows.attribution: not a duration: '30x' (use e.g. 30s, 5m, 1h, 1d)``.
Unknown tables and keys are refused too, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from rankwatch.consumers.decoding import FormatSpec, format_specs
from rankwatch.consumers.registry import RegistrySettings
from rankwatch.consumers.settings import KafkaSettings, security_options
from rankwatch.errors import ConfigError
from rankwatch.pipeline.events.mapping import IDENTITY, EventMapping
from rankwatch.pipeline.events.validation import DEFAULT_ACTION_GRADES
from rankwatch.pipeline.experiments.spec import ExperimentSpec, experiment_from_dict
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.durations import parse_duration_ms, parse_duration_or_zero_ms
from rankwatch.pipeline.stream.processor import StreamConfig

T = TypeVar("T")

# table -> allowed keys (None: free-form table, checked by its own reader)
SCHEMA: dict[str, frozenset[str] | None] = {
    "kafka": frozenset({"bootstrap_servers", "group_id", "auto_offset_reset", "checkpoint_interval",
                       "max_poll_records", "max_buffered_records", "max_partition_fetch_bytes", "tick_interval",
                       "session_timeout", "instance_id", "security", "shutdown_timeout", "retry_backoff_max",
                       "core_process", "timestamps", "overtake_grace"}),
    "topics": frozenset({"impressions", "clicks", "dead_letter", "checkpoints"}),
    "windows": frozenset({"sizes", "attribution", "allowed_disorder", "idle_timeout", "finalize_step"}),
    "slices": frozenset({"by", "max_values_per_label"}),
    "metrics": frozenset({"ndcg_cutoffs", "map_cutoffs", "gain", "map_normalization", "no_relevant",
                         "max_distinct_scores",

                         "precision_cutoffs", "recall_cutoffs", "hit_rate_cutoffs", "gauc_group", "gauc_weight",
                         "gauc_max_items", "ctr_ranks", "drift_bins"}),
    "limits": frozenset({"max_pending_requests", "max_items_per_request", "max_event_bytes", "dedupe_capacity",
                        "max_pending_feedback", "finalized_memory"}),
    "actions": None,
    "output": frozenset({"windows_out"}),
    "exporter": frozenset(
        {"enabled", "host", "port", "tls_certfile", "tls_keyfile", "basic_auth_user", "basic_auth_password_file",
         "web_config_file"}
    ),
    "baselines": frozenset({"files", "directory", "reload_interval"}),
    "events": None,  # [events.impressions] / [events.clicks]: checked by pipeline.events.mapping
    "schema_registry": frozenset({"url", "basic_auth_user", "basic_auth_password_file", "timeout"}),
    "transfer": frozenset({"ledgers", "reload_interval", "seed", "resamples"}),
}


@dataclass(frozen=True)
class ExporterSettings:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9108
    tls_certfile: Path | None = None  # TLS is on when both files are given
    tls_keyfile: Path | None = None
    basic_auth_user: str = ""  # basic auth on /metrics when set, password read from the file
    basic_auth_password_file: Path | None = None
    web_config_file: Path | None = None  # exporter-toolkit web config (TLS, client certs, bcrypt users)


@dataclass(frozen=True)
class RunConfig:
    """Everything ``rankwatch run`` needs, read from one TOML file."""

    kafka: KafkaSettings
    stream: StreamConfig
    exporter: ExporterSettings = ExporterSettings()
    windows_out: Path | None = None
    baselines: tuple[Path, ...] = ()  # [baselines] files (each must exist at start)
    baseline_reload_ms: int = 10_000
    baseline_directory: Path | None = None  # [baselines] directory: its *.json, rescanned at every reload
    source: Path | None = field(default=None, compare=False)
    experiments: tuple[ExperimentSpec, ...] = ()  # [[experiments]] (docs/experiments.md)
    events: EventMapping = IDENTITY  # [events.impressions] / [events.clicks] (docs/mapping.md)
    schema_registry: RegistrySettings | None = None  # [schema_registry], when given (docs/formats.md)
    formats: Mapping[str, FormatSpec] = field(default_factory=dict)  # Avro / Protobuf streams (docs/formats.md)
    # [transfer] (docs/transfer.md): ledgers served as rankwatch_transfer_* gauges
    transfer_ledgers: tuple[Path, ...] = ()
    transfer_reload_ms: int = 10_000
    transfer_seed: int = 0
    transfer_resamples: int = 2000


class _Reader:
    """Typed access to one table with errors that name ``table.key``."""

    def __init__(self, where: str, table: str, data: Mapping[str, Any]) -> None:
        self.where, self.table, self.data = where, table, data

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.table}.{key}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: T, convert: Callable[[Any], T] | None = None) -> T:
        if key not in self.data:
            return default
        value = self.data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(key, f"expected {names}, got {type(value).__name__} {value!r}")
        if convert is None:
            return value  # type: ignore[return-value]
        try:
            return convert(value)
        except (ValueError, TypeError) as e:
            raise self.fail(key, str(e)) from None

    def duration_ms(self, key: str, default: int) -> int:
        return self.get(key, str, default, parse_duration_ms)

    def positive_int(self, key: str, default: int) -> int:
        value = self.get(key, int, default)
        if value < 1:
            raise self.fail(key, f"must be >= 1, got {value}")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get(key, list, list(default))
        if not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, "expected a list of non-empty strings")
        return tuple(value)

    def ints(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self.get(key, list, list(default))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
            raise self.fail(key, "expected a list of positive integers")
        return tuple(value)


def load_config(path: str | Path) -> RunConfig:
    """Read and check ``path``; a :class:`ConfigError` naming the key on any problem."""
    path = Path(path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from None
    return config_from_dict(raw, where=where, base=path.parent)


def config_from_dict(raw: Mapping[str, Any], *, where: str = "config", base: Path | None = None) -> RunConfig:
    base = base or Path(".")
    experiments = experiments_from_toml(raw.get("experiments", []), where=where)
    raw = {k: v for k, v in raw.items() if k != "experiments"}
    for table, value in raw.items():
        if table not in SCHEMA:
            raise ConfigError(f"{where}: unknown table [{table}] (known: {', '.join(SCHEMA)})")
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {table}: expected a table")
        allowed = SCHEMA[table]
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    raise ConfigError(f"{where}: {table}.{key}: unknown key (known: {', '.join(sorted(allowed))})")
    r = {t: _Reader(where, t, raw.get(t, {})) for t in SCHEMA}
    kafka = _kafka(r["kafka"], r["topics"], where, base)
    stream = replace(_stream(r, where), experiments=experiments)
    ex = r["exporter"]
    port = ex.get("port", int, 9108)
    if not 0 <= port <= 65535:
        raise ex.fail("port", f"not a TCP port: {port}")
    exporter = _exporter(ex, base, port)
    out = r["output"].get("windows_out", str, "")
    bl = r["baselines"]
    files = [base / f for f in bl.strings("files", ())]
    for f in files:
        if not f.is_file():
            raise bl.fail("files", f"no such file: {f}")
    directory = bl.get("directory", str, "")
    d = base / directory if directory else None
    if d is not None and not d.is_dir():
        raise bl.fail("directory", f"not a directory: {d}")
    events = EventMapping.from_tables(raw.get("events"), where=where)
    registry = _registry(r["schema_registry"], base) if "schema_registry" in raw else None
    cfg = RunConfig(kafka=kafka, stream=stream, exporter=exporter,
                    windows_out=(base / out) if out else None, baselines=tuple(files),
                    baseline_reload_ms=bl.duration_ms("reload_interval", 10_000), baseline_directory=d,
                    experiments=experiments, events=events, schema_registry=registry,
                    formats=format_specs(events, base=base, registry=registry, where=where))
    return _with_transfer(cfg, r["transfer"], base)


def _registry(sr: _Reader, base: Path) -> RegistrySettings:
    settings = RegistrySettings.from_table(sr.data, where=f"{sr.where}: schema_registry", base=base)
    if settings.basic_auth_password_file is not None and not settings.basic_auth_password_file.is_file():
        raise sr.fail("basic_auth_password_file", f"no such file: {settings.basic_auth_password_file}")
    return settings


def load_events(path: str | Path) -> EventMapping:
    """Only the ``[events]`` tables of a config file (replay, ab, inspect): the other tables are checked
    as ``rankwatch run`` checks them, so one file serves every command."""
    return load_config(path).events


def _with_transfer(cfg: RunConfig, tr: _Reader, base: Path) -> RunConfig:
    """``[transfer]``: ledger files (need not exist yet: a ledger is appended to), reload interval, bootstrap."""
    seed = tr.get("seed", int, 0)
    if seed < 0:
        raise tr.fail("seed", f"must be >= 0, got {seed}")
    return replace(cfg, transfer_ledgers=tuple(base / f for f in tr.strings("ledgers", ())),
                   transfer_reload_ms=tr.duration_ms("reload_interval", 10_000), transfer_seed=seed,
                   transfer_resamples=tr.positive_int("resamples", 2000))


def experiments_from_toml(value: Any, *, where: str = "config") -> tuple[ExperimentSpec, ...]:
    """The ``[[experiments]]`` array of tables; a :class:`ConfigError` naming ``experiments[i].key``."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError(f"{where}: experiments: expected an array of tables ([[experiments]])")
    out: list[ExperimentSpec] = []
    for i, table in enumerate(value):
        try:
            out.append(experiment_from_dict(table))
        except ValueError as e:
            raise ConfigError(f"{where}: experiments[{i}].{e}") from None
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: experiments: names must be unique, got {names}")
    return tuple(out)


def _exporter(ex: _Reader, base: Path, port: int) -> ExporterSettings:
    def existing_file(key: str) -> Path | None:
        name = ex.get(key, str, "")
        if not name:
            return None
        path = base / name
        if not path.is_file():
            raise ex.fail(key, f"no such file: {path}")
        return path

    cert, key = existing_file("tls_certfile"), existing_file("tls_keyfile")
    if (cert is None) != (key is None):
        raise ex.fail("tls_keyfile" if key is None else "tls_certfile", "TLS needs both tls_certfile and tls_keyfile")
    user, password_file = ex.get("basic_auth_user", str, ""), existing_file("basic_auth_password_file")
    if bool(user) != (password_file is not None):
        raise ex.fail("basic_auth_password_file" if user else "basic_auth_user",
                      "basic auth needs both basic_auth_user and basic_auth_password_file")
    web = existing_file("web_config_file")
    if web is not None and (cert or user):
        raise ex.fail("web_config_file", "give either web_config_file or the tls_*/basic_auth_* keys, not both")
    return ExporterSettings(enabled=ex.get("enabled", bool, True), host=ex.get("host", str, "127.0.0.1"),
                            port=port, tls_certfile=cert, tls_keyfile=key, basic_auth_user=user,
                            basic_auth_password_file=password_file, web_config_file=web)


def _kafka(k: _Reader, t: _Reader, where: str, base: Path = Path(".")) -> KafkaSettings:
    try:  # <secret>_file keys read here (docs/security.md); secrets kept as Secret (never printed)
        security = security_options(k.get("security", dict, {}), base)
    except ValueError as e:
        raise ConfigError(f"{where}: kafka.security.{e}") from None
    servers = k.get("bootstrap_servers", (list, str), ["127.0.0.1:9092"])
    servers_t = (servers,) if isinstance(servers, str) else tuple(servers)
    if not servers_t or not all(isinstance(s, str) and ":" in s for s in servers_t):
        raise k.fail("bootstrap_servers", "expected host:port strings")
    reset = k.get("auto_offset_reset", str, "earliest")
    if reset not in ("earliest", "latest"):
        raise k.fail("auto_offset_reset", f"must be 'earliest' or 'latest', got {reset!r}")
    imp, clk = t.get("impressions", str, "impressions"), t.get("clicks", str, "clicks")
    if imp == clk:
        raise t.fail("clicks", "must differ from topics.impressions")
    return KafkaSettings(
        bootstrap_servers=servers_t,
        impressions_topic=imp,
        clicks_topic=clk,
        group_id=k.get("group_id", str, "rankwatch"),
        checkpoint_topic=t.get("checkpoints", str, "") or None,
        dead_letter_topic=t.get("dead_letter", str, "") or None,
        checkpoint_interval_s=k.duration_ms("checkpoint_interval", 10_000) / 1000,
        tick_interval_s=k.duration_ms("tick_interval", 1_000) / 1000,
        session_timeout_s=k.duration_ms("session_timeout", 10_000) / 1000,
        instance_id=k.get("instance_id", str, "") or None,
        auto_offset_reset=reset,
        max_poll_records=k.positive_int("max_poll_records", 2000),
        max_buffered_records=k.positive_int("max_buffered_records", 20_000),
        max_partition_fetch_bytes=k.positive_int("max_partition_fetch_bytes", 4 * 1024 * 1024),
        client_options=MappingProxyType(dict(security)),
        shutdown_timeout_s=k.duration_ms("shutdown_timeout", 15_000) / 1000,
        retry_backoff_max_s=k.duration_ms("retry_backoff_max", 5_000) / 1000,
        core_process=k.get("core_process", bool, True),
        timestamps=_timestamps(k),
        overtake_grace_s=k.get("overtake_grace", str, 250, parse_duration_or_zero_ms) / 1000,
    )


def _timestamps(k: _Reader) -> str:
    value = k.get("timestamps", str, "event")
    if value not in ("record", "event"):
        raise k.fail("timestamps", f"must be 'record' or 'event', got {value!r}")
    return value


def _stream(r: dict[str, _Reader], where: str) -> StreamConfig:
    w, s, m, lim, act = r["windows"], r["slices"], r["metrics"], r["limits"], r["actions"]
    sizes = w.strings("sizes", ("5m", "1h"))
    for size in sizes:
        try:
            parse_duration_ms(size)
        except ValueError as e:
            raise w.fail("sizes", str(e)) from None
    if len({parse_duration_ms(x) for x in sizes}) != len(sizes):
        raise w.fail("sizes", "window sizes must be distinct")
    grades = dict(DEFAULT_ACTION_GRADES)
    for action, grade in act.data.items():
        if not isinstance(grade, int) or isinstance(grade, bool) or grade < 0:
            raise act.fail(action, "expected a non-negative integer grade")
        grades[action] = grade
    try:
        slice_spec = SliceSpec(by=s.strings("by", ("segment", "surface")),
                               max_values_per_label=s.positive_int("max_values_per_label", 50))
    except ValueError as e:
        raise s.fail("by", str(e)) from None
    try:
        options = MetricOptions(
            ndcg_cutoffs=m.ints("ndcg_cutoffs", (5, 10)), map_cutoffs=m.ints("map_cutoffs", (10,)),
            gain=m.get("gain", str, "exponential"),  # type: ignore[arg-type]
            map_normalization=m.get("map_normalization", str, "relevant"),  # type: ignore[arg-type]
            no_relevant=m.get("no_relevant", str, "skip"),  # type: ignore[arg-type]
            max_distinct_scores=m.positive_int("max_distinct_scores", 200_000),
            precision_cutoffs=m.ints("precision_cutoffs", (5, 10)), recall_cutoffs=m.ints("recall_cutoffs", (10,)),
            hit_rate_cutoffs=m.ints("hit_rate_cutoffs", (10,)),
            gauc_group=m.get("gauc_group", str, "user"),  # type: ignore[arg-type]
            gauc_weight=m.get("gauc_weight", str, "impressions"),  # type: ignore[arg-type]
            gauc_max_items=m.positive_int("gauc_max_items", 500_000),
            ctr_ranks=m.positive_int("ctr_ranks", 10), drift_bins=m.positive_int("drift_bins", 20),
        )
    except ValueError as e:
        keys = ("gain", "map_normalization", "no_relevant", "max_distinct_scores", "gauc_group", "gauc_weight")
        key = next((k for k in keys if k in str(e)), "gain")
        raise m.fail(key, str(e)) from None
    disorder = w.get("allowed_disorder", str, 60_000, parse_duration_or_zero_ms)
    return StreamConfig(
        windows=sizes,
        attribution_window_ms=w.duration_ms("attribution", 30 * 60_000),
        allowed_disorder_ms=disorder,
        idle_timeout_ms=w.duration_ms("idle_timeout", 120_000),
        finalize_step_ms=w.duration_ms("finalize_step", 1_000),
        max_pending_requests=lim.positive_int("max_pending_requests", 1_000_000),
        max_items_per_request=lim.positive_int("max_items_per_request", 200),
        max_event_bytes=lim.positive_int("max_event_bytes", 1_000_000),
        dedupe_capacity=lim.positive_int("dedupe_capacity", 5_000_000),
        max_pending_feedback=lim.positive_int("max_pending_feedback", 1_000_000),
        finalized_memory=lim.positive_int("finalized_memory", 1_000_000),
        action_grades=MappingProxyType(grades),
        metric_options=options,
        slice_spec=slice_spec,
    )
