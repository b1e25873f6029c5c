"""The ``photon.toml`` configuration: every option declared once, typed, with a default and a doc.

Unknown keys and bad values are rejected with :class:`ConfigError`, whose message names the file and the
key (``photon.toml: [join].unjoinable_after_s must be a number > 0, got -1``). Relative paths are taken
relative to the config file's folder. Rooms read their own section (``config.registry``, ...).
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints


class ConfigError(ValueError):
    """A configuration problem; the message names the file and the key."""


def opt(default: Any, doc: str, *, check=None, choices=None):
    """Declare an option: its default, what it means, and optionally a check ``value -> error or None``."""
    meta = {"doc": doc, "check": check, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _positive(v):
    return None if v > 0 else "must be > 0"


def _non_negative(v):
    return None if v >= 0 else "must be >= 0"


def _fraction(v):
    return None if 0 <= v <= 1 else "must be between 0 and 1"


def _name(v):
    ok = v and all(c.isalnum() or c in "-_" for c in v)
    return None if ok else "must be a non-empty name of letters, digits, - and _"


@dataclass(frozen=True)
class JoinConfig:
    """``[join]``: what is joined with what."""
    primary_stream: str = opt("queries", "folder (or S3 prefix) of the primary stream under log_root", check=_name)
    foreign_stream: str = opt("clicks", "folder (or S3 prefix) of the foreign stream under log_root", check=_name)
    primary_id_field: str = opt("query_id", "field holding a primary event's id")
    foreign_id_field: str = opt("click_id", "field holding a foreign event's id")
    foreign_ref_field: str = opt("query_id", "field of the foreign event naming its primary event")
    nest_primary_as: str = opt("query", "key under which the joined output nests the primary event")
    unjoinable_after_s: float = opt(60.0, "give up on a foreign event this long after first seeing it",
                                    check=_positive)


@dataclass(frozen=True)
class RegionConfig:
    """``[[regions]]``: one region's copy of the logs and where its output and state go."""
    name: str = opt("", "the region's name (letters, digits, - and _)", check=_name)
    log_root: str = opt("", "folder holding the region's copy of the streams")
    output_root: str = opt("", "folder for joined/, unjoinable/ and quarantine/")
    state_dir: str = opt("", "folder for the region's offsets, retry queue and process state")

    @property
    def joined_dir(self) -> Path:
        return Path(self.output_root) / "joined"

    @property
    def unjoinable_dir(self) -> Path:
        return Path(self.output_root) / "unjoinable"

    @property
    def quarantine_dir(self) -> Path:
        return Path(self.output_root) / "quarantine"


@dataclass(frozen=True)
class RegistryConfig:
    """``[registry]``: the Raft-replicated IdRegistry."""
    shards: int = opt(1, "number of registry shards (each its own Raft group)", check=_positive)
    replicas: int = opt(3, "replicas per shard", check=_positive)
    replica_regions: list = opt([], "region of each replica, in order (default: all in the first region)")
    host: str = opt("127.0.0.1", "address registry replicas bind to")
    port_base: int = opt(0, "first port to use (raft and gRPC ports follow); 0 picks free ports once and "
                            "remembers them in the data dir", check=_non_negative)
    data_dir: str = opt("", "folder for Raft journals and snapshots (default: <first region state_dir>/registry)")
    gc_after_s: float = opt(3 * 86400.0, "ids older than this are garbage collected", check=_positive)
    max_clock_skew_s: float = opt(60.0, "bound S on clock skew between servers", check=_positive)
    fsync: str = opt("batch", "journal fsync policy", choices=["none", "batch", "interval"])
    fsync_interval_ms: float = opt(5.0, "with fsync = \"interval\": at most this long between fsyncs",
                                   check=_positive)
    max_in_flight: int = opt(4, "replicated commands a shard leader keeps in flight to Raft at once",
                             check=_positive)
    max_ids_per_command: int = opt(20000, "most ids one replicated command carries", check=_positive)
    max_queued_ids: int = opt(200000, "ids a shard leader lets wait for Raft; beyond it clients get "
                                      "RESOURCE_EXHAUSTED and back off", check=_positive)
    snapshot_after_commands: int = opt(2000, "snapshot the state after this many journal entries",
                                       check=_positive)
    simulated_rtt_ms: float = opt(0.0, "benchmarks only: delay every message between replicas by this round trip",
                                  check=_non_negative)


@dataclass(frozen=True)
class EventStoreConfig:
    """``[eventstore]``: the CacheEventStore of each region."""
    cache_mb: float = opt(512.0, "bytes of recent primary events kept in memory", check=_positive)
    host: str = opt("127.0.0.1", "address the event store binds to")


@dataclass(frozen=True)
class JoinerConfig:
    """``[joiner]``: the stateless join service."""
    per_region: int = opt(2, "joiner processes per region", check=_positive)
    max_in_flight: int = opt(8, "batches a joiner works on at once; more are answered THROTTLED",
                             check=_positive)
    adapter: str = opt("", "\"module:callable\" building the joined event (default: DESIGN joined format)")
    commit_patience_s: float = opt(300.0, "how long a joiner retries a registry commit with the same token after "
                                          "failures whose outcome is unknown, before giving the events up "
                                          "(they may then be registered but not written: the verification "
                                          "job's case)", check=_non_negative)
    store_behind_s: float = opt(5.0, "an event store whose logs are read only up to longer ago than this is "
                                     "catching up: a primary it does not hold may still come, so the click "
                                     "is answered THROTTLED (retried, never given up) instead of NOT_FOUND",
                                check=_positive)
    roll_interval_s: float = opt(1.0, "roll (publish) an output file at least this often", check=_positive)
    roll_mb: float = opt(64.0, "roll an output file once it reaches this size", check=_positive)
    host: str = opt("127.0.0.1", "address joiners bind to")


@dataclass(frozen=True)
class DispatcherConfig:
    """``[dispatcher]``: tails the foreign logs and feeds the joiners."""
    batch_size: int = opt(500, "foreign events per joiner request", check=_positive)
    max_in_flight: int = opt(4, "joiner requests outstanding at once", check=_positive)
    retry_initial_s: float = opt(0.05, "first retry delay for NOT_FOUND / THROTTLED (doubles per attempt)",
                                 check=_positive)
    retry_max_s: float = opt(8.0, "longest retry delay", check=_positive)
    min_attempts: int = opt(3, "attempts before an event may be declared unjoinable", check=_positive)
    checkpoint_interval_s: float = opt(0.2, "how often offsets and the retry queue are persisted",
                                       check=_positive)
    poll_interval_s: float = opt(0.02, "wait between scans of the logs when nothing new was found",
                                 check=_positive)


@dataclass(frozen=True)
class SparkConfig:
    """``[spark]``: the Spark session of the batch jobs (verify, recover, sql, compact, build-map)."""
    master: str = opt("local[*]", "Spark master URL: local[*] (all cores of this machine), local[N], or "
                                  "spark://host:port of a standalone cluster")
    driver_memory: str = opt("2g", "memory of the Spark driver JVM (spark.driver.memory), e.g. 2g")
    shuffle_partitions: int = opt(8, "spark.sql.shuffle.partitions of the jobs", check=_positive)
    local_dir: str = opt("", "scratch folder for Spark (spark.local.dir; default: the system's temp folder)")
    conf: dict = opt({}, "extra Spark settings, e.g. conf = { \"spark.executor.memory\" = \"4g\" }")


@dataclass(frozen=True)
class VerifyConfig:
    """``[verify]``: the verification and recovery jobs (``photon verify``, ``photon recover``)."""
    out_dir: str = opt("", "folder for verify's results (recoverable events as Parquet, registry exports) and "
                           "recover's intent files (default: <first region state_dir>/verify)")
    remote_joiner_grace_s: float = opt(300.0, "a joiner on another host (its pid cannot be checked here) counts as "
                                              "stopped once its status file has not been rewritten for this long",
                                       check=_positive)


@dataclass(frozen=True)
class PhotonConfig:
    join: JoinConfig = field(default_factory=JoinConfig)
    regions: list = field(default_factory=list)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    eventstore: EventStoreConfig = field(default_factory=EventStoreConfig)
    joiner: JoinerConfig = field(default_factory=JoinerConfig)
    dispatcher: DispatcherConfig = field(default_factory=DispatcherConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    path: str = ""

    def region(self, name: str) -> RegionConfig:
        for r in self.regions:
            if r.name == name:
                return r
        raise ConfigError(f"{self.path}: no region named {name!r} (have {[r.name for r in self.regions]})")

    @property
    def verify_dir(self) -> Path:
        return Path(self.verify.out_dir) if self.verify.out_dir else Path(self.regions[0].state_dir) / "verify"

    @property
    def registry_data_dir(self) -> Path:
        if self.registry.data_dir:
            return Path(self.registry.data_dir)
        return Path(self.regions[0].state_dir) / "registry"


_SECTIONS = {"join": JoinConfig, "registry": RegistryConfig, "eventstore": EventStoreConfig,
             "joiner": JoinerConfig, "dispatcher": DispatcherConfig, "spark": SparkConfig,
             "verify": VerifyConfig}
_PATH_KEYS = {"log_root", "output_root", "state_dir", "data_dir", "out_dir"}


def _check_type(where: str, value: Any, typ: type) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and isinstance(value, bool):
        return value
    if typ is dict and isinstance(value, dict):
        bad = [k for k, v in value.items() if not isinstance(v, (str, int, float, bool))]
        if bad:
            raise ConfigError(f"{where}.{bad[0]} must be a string, number or boolean")
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    if typ in (int, float, str, list) and isinstance(value, typ) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{where} must be {typ.__name__}, got {type(value).__name__} {value!r}")


def _build(cls, table: Any, where: str, base: Path):
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table, got {type(table).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(fields))})")
    values = {}
    for name, value in table.items():
        key = f"{where}.{name}"
        value = _check_type(key, value, hints[name])
        meta = fields[name].metadata
        if meta.get("choices") and value not in meta["choices"]:
            raise ConfigError(f"{key} must be one of {meta['choices']}, got {value!r}")
        if meta.get("check") and (problem := meta["check"](value)):
            raise ConfigError(f"{key} {problem}, got {value!r}")
        if name in _PATH_KEYS and value and "://" not in value:
            value = str((base / Path(value).expanduser()).resolve())
        values[name] = value
    return cls(**values)


def parse_config(data: dict, path: str = "<config>", base: Path | None = None) -> PhotonConfig:
    base = base or Path.cwd()
    unknown = sorted(set(data) - set(_SECTIONS) - {"regions"})
    if unknown:
        raise ConfigError(f"{path}: unknown section [{unknown[0]}] (known: [{'], ['.join(sorted(_SECTIONS))}], "
                          f"[[regions]])")
    sections = {name: _build(cls, data.get(name, {}), f"{path}: [{name}]", base) for name, cls in _SECTIONS.items()}
    raw_regions = data.get("regions", [])
    if not isinstance(raw_regions, list) or not raw_regions:
        raise ConfigError(f"{path}: at least one [[regions]] entry is required")
    regions = []
    for i, table in enumerate(raw_regions):
        where = f"{path}: [[regions]] #{i + 1}"
        region = _build(RegionConfig, table, where, base)
        for key in ("name", "log_root", "output_root", "state_dir"):
            if not getattr(region, key):
                raise ConfigError(f"{where}: missing required key {key!r}")
        regions.append(region)
    names = [r.name for r in regions]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: region names must be unique, got {names}")
    reg = sections["registry"]
    for r in reg.replica_regions:
        if r not in names:
            raise ConfigError(f"{path}: [registry].replica_regions names unknown region {r!r} (regions: {names})")
    if reg.replica_regions and len(reg.replica_regions) != reg.replicas:
        raise ConfigError(f"{path}: [registry].replica_regions has {len(reg.replica_regions)} entries "
                          f"but replicas = {reg.replicas}")
    return PhotonConfig(regions=regions, path=path, **sections)


def load_config(path: str | Path) -> PhotonConfig:
    """Read and validate ``photon.toml``; raises :class:`ConfigError` naming the file and the bad key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read: {e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    return parse_config(data, str(p), p.resolve().parent)


def describe_options() -> str:
    """Every option with its default and doc, for ``photon config --help`` and the README."""
    lines = []
    for name, cls in [*_SECTIONS.items(), ("[regions]", RegionConfig)]:
        lines.append(f"[{name}]")
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            lines.append(f"  {f.name} = {default!r}    # {f.metadata['doc']}")
    return "\n".join(lines)
