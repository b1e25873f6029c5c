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

from photon._ids import MAX_CUSTOM_ID_CHARS, TIME_FORMATS, EventIds


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


def _field_name(v):
    return None if "\n" not in v and v == v.strip() else "must be a field name (no spaces around it, no line break)"


def _stream(v):
    ok = v and all(part and all(c.isalnum() or c in "-_." for c in part) and part not in (".", "..")
                   for part in v.split("/"))
    return None if ok else "must be a folder name or path (letters, digits, -, _ and . separated by /)"


@dataclass(frozen=True)
class JoinConfig:
    """``[join]``: what is joined with what."""
    primary_stream: str = opt("queries", "folder (or S3 prefix) of the primary stream under log_root", check=_stream)
    foreign_stream: str = opt("clicks", "folder (or S3 prefix) of the foreign stream under log_root", check=_stream)
    primary_id_field: str = opt("query_id", "field holding a primary event's id")
    foreign_id_field: str = opt("click_id", "field holding a foreign event's id")
    foreign_ref_field: str = opt("query_id", "field of the foreign event naming its primary event")
    nest_primary_as: str = opt("query", "key under which the joined output nests the primary event")
    unjoinable_after_s: float = opt(60.0, "give up on a foreign event this long after first seeing it",
                                    check=_positive)
    primary_time_field: str = opt("", "field holding a primary event's time; empty: ids are Photon ids "
                                      "(<ip>:<pid>:<16-digit µs>, the time inside). Set, ids may be any string "
                                      f"of 1 to {MAX_CUSTOM_ID_CHARS} characters without a line break, not "
                                      "starting with ':'", check=_field_name)
    primary_time_format: str = opt("epoch_us", "how primary_time_field is written", choices=list(TIME_FORMATS))
    foreign_time_field: str = opt("", "field holding a foreign event's time; empty: ids are Photon ids. Set, "
                                      "ids may be any string as for primary_time_field, and an event is known "
                                      "by its id and this time (its copies must carry the same time)",
                                  check=_field_name)
    foreign_time_format: str = opt("epoch_us", "how foreign_time_field is written", choices=list(TIME_FORMATS))

    @property
    def primary_ids(self) -> EventIds:
        """How primary events are identified (id field, optional time field): see photon.EventIds."""
        return EventIds(self.primary_id_field, self.primary_time_field, self.primary_time_format)

    @property
    def foreign_ids(self) -> EventIds:
        """How foreign events are identified: see photon.EventIds."""
        return EventIds(self.foreign_id_field, self.foreign_time_field, self.foreign_time_format)


def recovery_stream(stream: str) -> str:
    """The recovery stream beside ``stream`` (``clicks`` -> ``clicks-recovery``): ``photon recover`` writes
    re-injected lines there, every region's dispatcher tails it, and verify reads it as input."""
    return f"{stream.rstrip('/')}-recovery"


@dataclass(frozen=True)
class RegionConfig:
    """``[[regions]]``: one region's copy of the logs and where its output and state go."""
    name: str = opt("", "the region's name (letters, digits, - and _)", check=_name)
    log_root: str = opt("", "folder or s3://bucket/prefix holding the region's copy of the streams")
    output_root: str = opt("", "folder or s3://bucket/prefix for joined/, unjoinable/ and quarantine/")
    state_dir: str = opt("", "folder for the region's offsets, retry queue and process state")
    host: str = opt("", "address this region's processes bind to and are reached at by the other regions "
                        "(default: each component's own [..].host, 127.0.0.1)")
    port_base: int = opt(0, "first of this region's fixed ports, so that every machine derives the same "
                            "addresses from the one config (see REGION_PORTS); 0: free ports picked once and "
                            "remembered in state_dir", check=_non_negative)
    registry_only: bool = opt(False, "the region hosts IdRegistry replicas only (no logs, no pipeline; "
                                     "log_root and output_root may be omitted)")

    def bind_host(self, default: str) -> str:
        """The address this region's processes bind to: the region's ``host``, else ``default``."""
        return self.host or default

    def _output_dir(self, kind: str) -> Path:
        from photon._storage import storage_kind
        return storage_kind(self.output_root).output_folder(self.output_root, kind, self.state_dir)

    def output_url(self, kind: str) -> str:
        """Where published ``kind`` files (``joined``, ``unjoinable``, ``quarantine``) end up: a folder, or
        a prefix of an object kind (``s3://``)."""
        from photon._storage import join_location
        return join_location(self.output_root, kind)

    def stream_url(self, stream: str) -> str:
        """The location of ``stream`` under ``log_root`` (a folder or an ``s3://`` prefix)."""
        from photon._storage import join_location
        return join_location(self.log_root, stream)

    def output_reader(self, kind: str, s3=None):
        """The :class:`photon.OutputReader` of this region's ``kind`` output (``joined``, ``unjoinable``): its
        published output and, for a kind that stages output locally, the staging folder beside it."""
        from photon._storage import output_reader
        return output_reader(self.output_url(kind), s3, outbox=self._output_dir(kind))

    @property
    def joined_dir(self) -> Path:
        """The local folder joiners write to (published there, or uploaded from there to S3)."""
        return self._output_dir("joined")

    @property
    def unjoinable_dir(self) -> Path:
        return self._output_dir("unjoinable")

    @property
    def quarantine_dir(self) -> Path:
        return self._output_dir("quarantine")


def _endpoint(v):
    return None if not v or v.startswith(("http://", "https://")) else "must start with http:// or https://"


@dataclass(frozen=True)
class S3Config:
    """``[s3]``: how Photon reaches S3 for ``s3://bucket/prefix`` log and output roots. Credentials come
    from boto3's standard chain (environment, shared files, instance role)."""
    endpoint_url: str = opt("", "S3 endpoint URL; empty: the AWS_ENDPOINT_URL environment variable, else "
                                "AWS's own endpoint", check=_endpoint)
    region_name: str = opt("", "AWS region; empty: boto3's standard chain (AWS_DEFAULT_REGION, profile), "
                               "else us-east-1")
    list_interval_s: float = opt(0.25, "a stream is listed at most this often (reads of objects already "
                                       "listed go on in between)", check=_non_negative)
    full_list_interval_s: float = opt(10.0, "every this often a stream is listed whole (not only past its "
                                            "last key), which finds late objects that sort before it, "
                                            "replaced older objects and deleted ones", check=_positive)
    retry_attempts: int = opt(8, "attempts per S3 request on a transient error (throttling, 5xx, timeouts, "
                                 "lost connections), with exponential backoff", check=_positive)
    retry_max_s: float = opt(5.0, "longest wait between two attempts", check=_positive)
    connect_timeout_s: float = opt(5.0, "connect timeout per S3 request", check=_positive)
    read_timeout_s: float = opt(30.0, "read timeout per S3 request", check=_positive)
    multipart_mb: float = opt(64.0, "output files larger than this are uploaded in parts of this size "
                                    "(at least 5)", check=_positive)


@dataclass(frozen=True)
class InputConfig:
    """``[input]``: rules for reading log lines, local or on S3."""
    max_line_bytes: int = opt(4 << 20, "a line longer than this is quarantined (its first KiB kept) and "
                                       "skipped, never held in memory whole", check=_positive)
    retire_after_s: float = opt(300.0, "a local log file read to its end and unchanged this long is no longer "
                                       "stated on every poll (only by the full pass)", check=_positive)
    full_scan_s: float = opt(30.0, "every this often a local stream is listed and every file stated, so a "
                                   "retired file that grows again is read within this time", check=_positive)


REGION_PORTS = {
    # offsets from a region's port_base (when it is set)
    "dispatcher_metrics": 2,
    "control": 3,             # the region launcher's control endpoint (photon region down|up, status)
    "eventstore": 500,        # cache server n: gRPC at +500 + 2n, metrics at +501 + 2n (up to 50)
    "logstore": 600,          # logs store n: gRPC at +600 + 2n, metrics at +601 + 2n (up to 50)
    "joiners": 10,            # joiner i: gRPC at +10 + 2i, metrics at +11 + 2i (up to 45 joiners)
    "registry": 100,          # replica (shard s, replica r) hosted here: g = s * replicas + r;
                              # Raft at +100 + 3g, gRPC at +101 + 3g, metrics at +102 + 3g
}
DEFAULT_SPREAD_REPLICAS = 5   # with three or more regions and no replica_regions: 5 replicas as 2/2/1


def spread_replicas(regions: list[str], replicas: int) -> list[str]:
    """The default placement of a shard's replicas over regions: round robin in config order, so 5 over
    three regions is 2/2/1 and any one region can be lost."""
    return [regions[i % len(regions)] for i in range(replicas)]


@dataclass(frozen=True)
class RegistryConfig:
    """``[registry]``: the Raft-replicated IdRegistry."""
    shards: int = opt(1, "number of registry shards (each its own Raft group)", check=_positive)
    replicas: int = opt(3, "replicas per shard", check=_positive)
    replica_regions: list = opt([], "region of each replica, in order (default: with three or more regions, "
                                    "5 replicas spread 2/2/1 round robin over the regions; else all in the first region)")
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
    clear_tokens_every_s: float = opt(300.0, "`photon run` runs `photon registry clear-tokens` for its regions this "
                                             "often (clearing the tokens of ids found in published joined output); "
                                             "0: never", check=_non_negative)


@dataclass(frozen=True)
class EventStoreConfig:
    """``[eventstore]``: the CacheEventStore of each region."""
    cache_mb: float = opt(512.0, "MB of recent primary events kept in memory per region (split evenly over "
                                 "the cache servers)", check=_positive)
    host: str = opt("127.0.0.1", "address the event store binds to")
    cache_servers: int = opt(1, "cache servers per region; ids are routed to them by a consistent-hash ring "
                                "(mmh3, virtual nodes)", check=_positive)
    ring_vnodes: int = opt(64, "virtual nodes per cache server on the ring", check=_positive)
    logs_stores: int = opt(1, "LogsEventStore processes per region (they answer what the cache missed from "
                              "the log-file map); 0 runs none", check=_non_negative)
    map_every_s: float = opt(10.0, "W: the log-file map gets an entry for a server_ip:process_id in a file at "
                                   "least every W seconds of event time", check=_positive)
    map_every_kb: int = opt(256, "M: ... and at least every M KB of file; a logs-store lookup reads about M KB",
                            check=_positive)
    warm_tail_s: float = opt(300.0, "a restarted cache server re-reads this much event time (before the newest "
                                    "map entry) of primary logs to warm its cache", check=_non_negative)
    checkpoint_interval_s: float = opt(1.0, "how often the primary reader persists its offsets (map entries are "
                                            "fsynced first)", check=_positive)
    logs_open_files: int = opt(64, "open primary files a logs store keeps (least recently used closed first)",
                               check=_positive)
    map_refresh_s: float = opt(0.2, "how often a logs store loads the map entries that landed", check=_positive)


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
    roll_interval_s: float = opt(60.0, "roll (publish) an output file at least this often (readers following "
                                       "the output contract see its lines much sooner: commit_interval_ms)",
                                 check=_positive)
    roll_mb: float = opt(64.0, "roll an output file once it reaches this size", check=_positive)
    commit_interval_ms: float = opt(50.0, "publish the output commit record (how far each open file is "
                                          "committed) at most this often while lines are written",
                                    check=_positive)
    host: str = opt("127.0.0.1", "address joiners bind to")
    writer_probe_s: float = opt(1.0, "after an output write failed (disk full), how often the joiner tries a "
                                     "probe write; until one succeeds it answers THROTTLED without committing",
                                check=_positive)
    stop_patience_s: float = opt(15.0, "on SIGTERM, how long a joiner keeps working on the requests it has started "
                                       "(retrying their commits and writes) before it records their ids in the "
                                       "lost-ids ledger as 'commit outcome unknown' and exits; keep it below the "
                                       "launcher's stop grace (20 s)", check=_positive)


@dataclass(frozen=True)
class DispatcherConfig:
    """``[dispatcher]``: tails the foreign logs and feeds the joiners."""
    batch_size: int = opt(500, "foreign events per joiner request", check=_positive)
    max_in_flight: int = opt(4, "joiner requests outstanding at once", check=_positive)
    backlog_batch_size: int = opt(2000, "foreign events per joiner request while a backlog waits (more queued "
                                        "than max_in_flight requests of batch_size carry): the backlog is "
                                        "spread over the free request slots in requests of up to this many "
                                        "(never fewer than batch_size), so each lookup, join, registry commit "
                                        "and output commit carries more clicks", check=_positive)
    retry_initial_s: float = opt(0.05, "first retry delay for NOT_FOUND / THROTTLED (doubles per attempt)",
                                 check=_positive)
    retry_max_s: float = opt(8.0, "longest retry delay", check=_positive)
    min_attempts: int = opt(3, "attempts before an event may be declared unjoinable", check=_positive)
    checkpoint_interval_s: float = opt(0.2, "how often offsets and the retry queue are persisted",
                                       check=_positive)
    poll_interval_s: float = opt(0.02, "wait between scans of the logs when nothing new was found",
                                 check=_positive)
    max_unresolved: int = opt(100_000, "read-ahead bound: no more lines are read while this many events are "
                                        "unresolved (queued, in flight or waiting for a retry), so memory and "
                                        "checkpoint size stay bounded while joiners, event store or registry "
                                        "are down", check=_positive)
    share_by_region: bool = opt(True, "with two or more pipeline regions, each click's first region is picked by "
                                      "a hash of its id; the others hold it back for a grace period and join it "
                                      "only if the registry lookup then still finds it unjoined (fewer wasted "
                                      "joins; see docs/dispatcher.md)")
    share_grace_initial_ms: float = opt(200.0, "grace before a region takes another region's click, at start "
                                               "(it then adapts to how late the owner joins)", check=_positive)
    share_grace_min_ms: float = opt(20.0, "the shortest grace", check=_positive)
    share_grace_max_ms: float = opt(2000.0, "the longest grace", check=_positive)
    share_leader_fraction: float = opt(0.75, "when every registry shard's leader is in one pipeline region, the "
                                             "share of the clicks that region owns (its commits pay one round "
                                             "trip less than the others'; the rest is spread over the other "
                                             "pipeline regions)", check=_fraction)
    share_down_after_ms: float = opt(1000.0, "an owner region whose held clicks are found unjoined, none found "
                                             "joined, for this long (or its grace, if longer) is judged down: its "
                                             "share is then joined by the other regions at once (so a region that "
                                             "went down delays its share by at most its grace plus this)",
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
    class_archive: bool = opt(True, "keep an archive of the classes the driver's JVM loaded (class-data sharing, "
                                    "written by the first job, used by the next ones: a faster start); a "
                                    "missing or stale archive only costs speed")
    cache_dir: str = opt("", "folder of that archive and of the launch command (default: $XDG_CACHE_HOME/photon or "
                             "~/.cache/photon)")
    cached_launch: bool = opt(True, "start the driver's JVM with the command spark-submit's launcher gave for the "
                                    "same settings, environment, Java and Spark before (kept in cache_dir), "
                                    "without running that launcher's JVM again: a faster start")
    short_job_mb: int = opt(256, "a job whose input is known to be at most this many MB (photon verify over "
                                 "local folders) starts its driver JVM with the JIT's first tier only "
                                 "(-XX:TieredStopAtLevel=1: less compiling in a short run, slower in a long "
                                 "one) and the serial collector (-XX:+UseSerialGC, unless a collector is "
                                 "chosen in the JVM's flags); 0: never", check=_non_negative)


@dataclass(frozen=True)
class TlsConfig:
    """``[tls]``: mutual TLS on every gRPC connection and on the metrics endpoints, and a secret on Raft
    traffic (``photon certs`` makes test files). Off when ``ca`` is empty."""
    ca: str = opt("", "PEM file of the CA that signs every process's certificate (empty: TLS off)")
    cert: str = opt("", "PEM certificate of this deployment's processes (servers and clients)")
    key: str = opt("", "PEM private key of that certificate")
    server_name: str = opt("photon", "the name servers' certificates carry and clients check them for")
    raft_secret_file: str = opt("", "file whose contents authenticate and encrypt Raft traffic between "
                                    "registry replicas (empty: with TLS on, a secret derived from `key`; "
                                    "with TLS off, Raft in the clear)")


@dataclass(frozen=True)
class ControlConfig:
    """``[control]``: the control endpoint every region launcher serves at its region's ``host`` and
    ``port_base`` + 3 (``photon region down|up`` and ``photon status`` from any machine holding the config).
    Every request is authenticated: by mutual TLS when ``[tls]`` is on, else by an HMAC of the request
    made with the shared secret in ``secret_file``; with neither, the endpoint refuses every request."""
    secret_file: str = opt("", "file holding a shared secret (the same file on every machine) that authenticates "
                               "control requests when [tls] is off; empty: without [tls], remote control is off")
    max_skew_s: float = opt(60.0, "without [tls]: a signed request older or newer than this (by the "
                                  "launcher's clock) is refused", check=_positive)
    timeout_s: float = opt(5.0, "how long a client waits for a control endpoint to answer (region down/up "
                                "waits for the launcher to act on top of it: --wait)", check=_positive)


@dataclass(frozen=True)
class SqlConfig:
    """``[sql]``: the tables of ``photon sql`` (and the DataFrames of :func:`photon.app.joined_dataframe`)."""
    foreign_schema: str = opt("", "Spark DDL of the foreign event's fields, e.g. \"click_id STRING, cost_micros "
                                  "BIGINT\" (default: inferred from a sample of the stream, see sample_lines); "
                                  "fields not named are not columns, a value of the wrong type reads as NULL")
    primary_schema: str = opt("", "Spark DDL of the primary event's fields (default: inferred, as foreign_schema)")
    sample_lines: int = opt(1000, "without foreign_schema / primary_schema: how many lines of each stream (the "
                                  "newest files first) the schema is inferred from; the result is cached in "
                                  "<first region state_dir>/sql/schemas.json", check=_positive)


@dataclass(frozen=True)
class CompactConfig:
    """``[compact]``: ``photon compact`` (closed output partitions rewritten as Parquet)."""
    close_after_s: float = opt(300.0, "a partition (one UTC hour) is closed this long after its hour ended, "
                                      "once no file in it is still open", check=_non_negative)
    keep_jsonl_s: float = opt(3600.0, "a compacted partition's JSONL files are deleted this long after the "
                                      "swap (readers that listed them before the swap may still read them)",
                              check=_non_negative)
    sort_by: list = opt([], "columns each compacted partition is sorted by (default: the foreign id field)")
    every_s: float = opt(600.0, "with `photon run --compact`: how often compaction runs", check=_positive)


@dataclass(frozen=True)
class VerifyConfig:
    """``[verify]``: the verification and recovery jobs (``photon verify``, ``photon recover``)."""
    out_dir: str = opt("", "folder for verify's results (recoverable events as Parquet, registry exports) and "
                           "recover's intent files (default: <first region state_dir>/verify)")
    remote_joiner_grace_s: float = opt(300.0, "a joiner on another host (its pid cannot be checked here) counts as "
                                              "stopped once its status file has not been rewritten for this long",
                                       check=_positive)
    lost_after_s: float = opt(3600.0, "a lost click whose joiner cannot be seen from here (another host without a "
                                      "status file, a token that does not parse) is recoverable once it was "
                                      "registered this long ago; a joiner seen running always keeps its clicks",
                              check=_positive)
    keep_exports: int = opt(1, "registry exports of finished verify/recover runs kept under out_dir, newest first "
                               "(1: the one the last report's export_dir names; 0: every one); a running run's "
                               "export and one whose run ended without a report are never removed",
                            check=_non_negative)


@dataclass(frozen=True)
class PhotonConfig:
    join: JoinConfig = field(default_factory=JoinConfig)
    regions: list = field(default_factory=list)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    eventstore: EventStoreConfig = field(default_factory=EventStoreConfig)
    joiner: JoinerConfig = field(default_factory=JoinerConfig)
    dispatcher: DispatcherConfig = field(default_factory=DispatcherConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    s3: S3Config = field(default_factory=S3Config)
    input: InputConfig = field(default_factory=InputConfig)
    sql: SqlConfig = field(default_factory=SqlConfig)
    compact: CompactConfig = field(default_factory=CompactConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    path: str = ""

    def region(self, name: str) -> RegionConfig:
        for r in self.regions:
            if r.name == name:
                return r
        raise ConfigError(f"{self.path}: no region named {name!r} (have {[r.name for r in self.regions]})")

    @property
    def pipeline_regions(self) -> list:
        """The regions that run a pipeline (every region but those with ``registry_only``)."""
        return [r for r in self.regions if not r.registry_only]

    def pipeline_regions_of(self, names=None) -> list:
        """The pipeline regions named in ``names`` (None: all of them), in config order."""
        return [r for r in self.pipeline_regions if names is None or r.name in names]

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
             "tls": TlsConfig, "s3": S3Config, "input": InputConfig, "sql": SqlConfig, "compact": CompactConfig,
             "verify": VerifyConfig, "control": ControlConfig}
_PATH_KEYS = {"log_root", "output_root", "state_dir", "data_dir", "ca", "cert", "key", "raft_secret_file", "out_dir",
              "secret_file"}


class _Problems:
    """Where validation problems go: raised at once (``collect=False``, :func:`load_config`), or all
    gathered (``collect=True``, :func:`check_config`), the bad value then left at its default."""

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.found: list[str] = []

    def __call__(self, message: str) -> None:
        if not self.collect:
            raise ConfigError(message)
        self.found.append(message)


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


def _build(cls, table: Any, where: str, base: Path, problem: _Problems | None = None):
    problem = problem or _Problems()
    if not isinstance(table, dict):
        problem(f"{where} must be a table, got {type(table).__name__}")
        return cls()
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in sorted(set(table) - set(fields)):
        problem(f"{where}: unknown key {name!r} (known keys: {', '.join(sorted(fields))})")
    values = {}
    for name, value in table.items():
        if name not in fields:
            continue
        key = f"{where}.{name}"
        try:
            value = _check_type(key, value, hints[name])
        except ConfigError as e:
            problem(str(e))
            continue
        meta = fields[name].metadata
        if meta.get("choices") and value not in meta["choices"]:
            problem(f"{key} must be one of {meta['choices']}, got {value!r}")
            continue
        if meta.get("check") and (bad := meta["check"](value)):
            problem(f"{key} {bad}, got {value!r}")
            continue
        if name in _PATH_KEYS and value and "://" not in value:
            value = str((base / Path(value).expanduser()).resolve())
        values[name] = value
    return cls(**values)


def parse_config(data: dict, path: str = "<config>", base: Path | None = None,
                 problem: _Problems | None = None) -> PhotonConfig:
    """Validate ``data`` (a parsed ``photon.toml``). Raises :class:`ConfigError` at the first problem, or,
    with a collecting ``problem`` sink, notes every problem and returns what could be built (None when no
    region could)."""
    base = base or Path.cwd()
    problem = problem or _Problems()
    for name in sorted(set(data) - set(_SECTIONS) - {"regions"}):
        problem(f"{path}: unknown section [{name}] (known: [{'], ['.join(sorted(_SECTIONS))}], [[regions]])")
    sections = {name: _build(cls, data.get(name, {}), f"{path}: [{name}]", base, problem)
                for name, cls in _SECTIONS.items()}
    raw_regions = data.get("regions", [])
    if not isinstance(raw_regions, list) or not raw_regions:
        problem(f"{path}: at least one [[regions]] entry is required")
        return None
    regions = []
    for i, table in enumerate(raw_regions):
        where = f"{path}: [[regions]] #{i + 1}"
        region = _build(RegionConfig, table, where, base, problem)
        required = ("name", "state_dir") if region.registry_only else ("name", "log_root", "output_root", "state_dir")
        missing = [key for key in required if not getattr(region, key)]
        for key in missing:
            problem(f"{where}: missing required key {key!r}")
        if not region.name:
            region = dataclasses.replace(region, name=f"#{i + 1}")
        regions.append(region)
    names = [r.name for r in regions]
    if len(set(names)) != len(names):
        problem(f"{path}: region names must be unique, got {names}")
    if not any(not r.registry_only for r in regions):
        problem(f"{path}: every region has registry_only = true; at least one must run the pipeline")
    reg = sections["registry"]
    if not reg.replica_regions and len(regions) >= 3:
        raw_registry = data.get("registry", {}) if isinstance(data.get("registry", {}), dict) else {}
        replicas = reg.replicas if "replicas" in raw_registry else DEFAULT_SPREAD_REPLICAS
        reg = sections["registry"] = dataclasses.replace(
            reg, replicas=replicas, replica_regions=spread_replicas(names, replicas))
    _check_port_ranges(path, regions, problem)
    _check_time_fields(path, sections["join"], problem)
    tls = sections["tls"]
    if tls.ca and not (tls.cert and tls.key):
        problem(f"{path}: [tls].ca is set, so [tls].cert and [tls].key are required too")
    for r in reg.replica_regions:
        if r not in names:
            problem(f"{path}: [registry].replica_regions names unknown region {r!r} (regions: {names})")
    if reg.replica_regions and len(reg.replica_regions) != reg.replicas:
        problem(f"{path}: [registry].replica_regions has {len(reg.replica_regions)} entries "
                f"but replicas = {reg.replicas}")
    return PhotonConfig(regions=regions, path=path, **sections)


def _check_time_fields(path: str, join: JoinConfig, problem: _Problems) -> None:
    """A time field is a field of its own: not the id field (nor, for clicks, the reference)."""
    for side, others in (("primary", ("primary_id_field",)), ("foreign", ("foreign_id_field", "foreign_ref_field"))):
        value = getattr(join, f"{side}_time_field")
        for other in others:
            if value and value == getattr(join, other):
                problem(f"{path}: [join].{side}_time_field must differ from {other}, got {value!r} for both")


REGION_PORT_SPAN = 1000   # a region with port_base P uses ports P .. P + 999


def _check_port_ranges(path: str, regions: list, problem: _Problems) -> None:
    """Two regions on the same host must not share fixed ports."""
    fixed = [r for r in regions if r.port_base]
    for i, a in enumerate(fixed):
        if a.port_base + REGION_PORT_SPAN > 65536:
            problem(f"{path}: [[regions]] {a.name!r}: port_base must be at most {65536 - REGION_PORT_SPAN} "
                    f"(a region uses {REGION_PORT_SPAN} ports from it), got {a.port_base}")
        for b in fixed[i + 1:]:
            if (a.host or "127.0.0.1") == (b.host or "127.0.0.1") and abs(a.port_base - b.port_base) < REGION_PORT_SPAN:
                problem(f"{path}: [[regions]] {a.name!r} and {b.name!r} share host "
                        f"{a.host or '127.0.0.1'} and their port_base values are less than "
                        f"{REGION_PORT_SPAN} apart ({a.port_base}, {b.port_base})")


def _read_toml(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read: {e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None


def load_config(path: str | Path) -> PhotonConfig:
    """Read and validate ``photon.toml``; raises :class:`ConfigError` naming the file and the bad key."""
    p = Path(path)
    return parse_config(_read_toml(p), str(p), p.resolve().parent)


def check_config(path: str | Path) -> tuple[PhotonConfig | None, list[str]]:
    """Every problem of the config file at ``path`` at once (``photon config --check``): ``(config, problems)``,
    the config built with each bad value left at its default (None when the file cannot be read or names no
    region), and one message per problem, each naming the file and the key."""
    p = Path(path)
    try:
        data = _read_toml(p)
    except ConfigError as e:
        return None, [str(e)]
    problems = _Problems(collect=True)
    config = parse_config(data, str(p), p.resolve().parent, problems)
    return config, problems.found


def describe_options() -> str:
    """Every option with its default and doc, for ``photon config --help`` and the README."""
    lines = []
    for name, cls in [*_SECTIONS.items(), ("[regions]", RegionConfig)]:
        lines.append(f"[{name}]")
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            lines.append(f"  {f.name} = {default!r}    # {f.metadata['doc']}")
    return "\n".join(lines)
