"""Photon's base: event ids, clock, configuration, log reading and writing, join outcomes, process specs.

Every room imports only these names. The base imports no room and never imports grpc or pysyncobj; the
launcher layer that imports the rooms (launcher, supervisor, run summary, generator, the ``photon`` command
line) lives above them in :mod:`photon.app`.
"""
from typing import TYPE_CHECKING

from photon._lazy import lazy_exports

_WHERE = {
    "Clock": "_clock", "FakeClock": "_clock", "SystemClock": "_clock",
    "REGION_PORT_SPAN": "_config", "REGION_PORTS": "_config", "ConfigError": "_config",
    "ControlConfig": "_config", "DispatcherConfig": "_config", "EventStoreConfig": "_config",
    "JoinConfig": "_config", "JoinerConfig": "_config", "PhotonConfig": "_config", "RegionConfig": "_config",
    "RegistryConfig": "_config", "S3Config": "_config", "InputConfig": "_config", "SparkConfig": "_config",
    "VerifyConfig": "_config", "describe_options": "_config", "load_config": "_config", "check_config": "_config",
    "parse_config": "_config", "recovery_stream": "_config",
    "LatencyHistogram": "_histogram",
    "ID_LINES": "_bulk", "all_event_ids": "_bulk", "bad_id_positions": "_bulk", "drop_at": "_bulk", "map_marking": "_bulk", "positions": "_bulk",
    "StringFields": "_bulk", "string_fields": "_bulk",
    "ID_REGEX": "_ids", "TIME_FORMATS": "_ids", "TIMESTAMP_DIGITS": "_ids", "BadEventId": "_ids",
    "EventId": "_ids", "EventIds": "_ids", "IdGenerator": "_ids", "custom_key": "_ids", "format_event_id": "_ids",
    "ID_KEY": "_ids", "ID_TIME_DIGITS": "_ids", "key_and_time": "_ids", "id_timestamp_us": "_ids", "is_event_id": "_ids", "key_id": "_ids", "parse_event_id": "_ids",
    "parse_event_time": "_ids", "MAX_TIME_US": "_ids", "check_custom_id": "_ids",
    "OUTCOMES": "_outcomes", "Outcome": "_outcomes",
    "TlsFiles": "_tls", "raft_password": "_tls", "raft_secret": "_tls", "secret_fingerprint": "_tls",
    "tls_env": "_tls", "tls_files": "_tls", "tls_paths": "_tls", "use_tls": "_tls",
    "MetricKinds": "_metrics", "NamedHTTPSConnection": "_metrics", "histogram_quantile": "_metrics",
    "scrape": "_metrics", "serve_metrics": "_metrics",
    "ProcessSpec": "_process", "region_ports": "_process", "remembered_ports": "_process",
    "ports_written_once": "_process",
    "settle_gc": "_gc", "GEN0_THRESHOLD": "_gc",
    "bind_port": "_service", "free_port": "_service", "run_service": "_service",
    "METRICS_AFTER_S": "_service", "serve_metrics_of": "_service",
    "LogChunk": "_logs", "Quarantine": "_logs", "list_log_files": "_logs", "parse_record": "_logs",
    "fsync_path": "_logs", "folder_unmade": "_logs", "wait_until": "_logs", "write_atomic": "_logs",
    "LinesLost": "_writer", "RollingWriter": "_writer",
    "DISPATCHER_DIR": "_horizon", "DISPATCHER_STATUS_FILE": "_horizon", "joined_horizon_us": "_horizon",
    "OutputSnapshot": "_output", "OutputTailer": "_output", "output_snapshot": "_output",
    "read_output_lines": "_output",
    "Location": "_source", "ObjectGone": "_source", "ObjectInfo": "_source", "SourceError": "_source",
    "SourceUnavailable": "_source", "open_source": "_source", "parse_location": "_source",
    "stream_source": "_source",
    "LogTailer": "_tail", "oldest_first": "_tail",
    "LockHeld": "_lock", "hold_lock": "_lock", "lock_holder": "_lock",
    "ObjectPublisher": "_publish", "S3Publisher": "_publish", "output_publisher": "_publish",
    "read_object_lines": "_publish",
    "SCHEMES": "_storage", "OutputReader": "_storage", "OutputSink": "_storage", "Source": "_storage",
    "StorageKind": "_storage", "join_location": "_storage", "local_folder": "_storage",
    "open_output_sink": "_storage", "output_reader": "_storage", "storage_kind": "_storage",
    "read_stream_json": "_spark_io", "stream_lines": "_spark_io", "stream_objects": "_spark_io",
}
"""Where each exported name lives. Names are imported on first use (PEP 562): every process of a pipeline
imports the base, and each needs only part of it (a registry replica no output contract, no process needs
the metrics' HTTP client before it serves), so none pays at start for the modules it does not use."""

if TYPE_CHECKING:
    from photon._clock import Clock, FakeClock, SystemClock
    from photon._config import (REGION_PORT_SPAN, REGION_PORTS, ConfigError, ControlConfig, DispatcherConfig, EventStoreConfig, JoinConfig, JoinerConfig,
                                PhotonConfig, RegionConfig, RegistryConfig, S3Config, InputConfig, SparkConfig, VerifyConfig, describe_options, load_config,
                                check_config, parse_config, recovery_stream)
    from photon._histogram import LatencyHistogram
    from photon._bulk import (ID_LINES, StringFields, all_event_ids, bad_id_positions, drop_at, map_marking, positions,
                              string_fields)
    from photon._ids import (ID_REGEX, TIME_FORMATS, TIMESTAMP_DIGITS, BadEventId, EventId, EventIds, IdGenerator, custom_key,
                             ID_KEY, ID_TIME_DIGITS, format_event_id, id_timestamp_us, is_event_id, key_and_time, key_id,
                             parse_event_id, parse_event_time,
                             MAX_TIME_US, check_custom_id)
    from photon._outcomes import OUTCOMES, Outcome
    from photon._tls import TlsFiles, raft_password, raft_secret, secret_fingerprint, tls_env, tls_files, tls_paths, use_tls
    from photon._metrics import MetricKinds, NamedHTTPSConnection, histogram_quantile, scrape, serve_metrics
    from photon._process import ProcessSpec, ports_written_once, region_ports, remembered_ports
    from photon._gc import GEN0_THRESHOLD, settle_gc
    from photon._service import METRICS_AFTER_S, bind_port, free_port, run_service, serve_metrics_of
    from photon._logs import (LogChunk, Quarantine, list_log_files, parse_record, folder_unmade, fsync_path,
                              wait_until, write_atomic)
    from photon._writer import LinesLost, RollingWriter
    from photon._horizon import DISPATCHER_DIR, DISPATCHER_STATUS_FILE, joined_horizon_us
    from photon._output import OutputSnapshot, OutputTailer, output_snapshot, read_output_lines
    from photon._source import (Location, ObjectGone, ObjectInfo, SourceError, SourceUnavailable, open_source,
                                parse_location, stream_source)
    from photon._tail import LogTailer, oldest_first
    from photon._lock import LockHeld, hold_lock, lock_holder
    from photon._publish import ObjectPublisher, S3Publisher, output_publisher, read_object_lines
    from photon._storage import (SCHEMES, OutputReader, OutputSink, Source, StorageKind, join_location, local_folder,
                                 open_output_sink, output_reader, storage_kind)
    from photon._spark_io import read_stream_json, stream_lines, stream_objects


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


__all__ = [
    "lazy_exports",
    "ID_LINES", "all_event_ids", "bad_id_positions", "drop_at", "map_marking", "positions", "oldest_first",
    "StringFields", "string_fields",
    "OUTCOMES", "Outcome", "recovery_stream", "MetricKinds", "histogram_quantile", "NamedHTTPSConnection", "scrape", "serve_metrics", "TlsFiles", "raft_password", "raft_secret", "secret_fingerprint", "tls_env", "tls_files", "tls_paths", "use_tls", "REGION_PORT_SPAN", "REGION_PORTS", "ProcessSpec", "region_ports", "remembered_ports", "ports_written_once", "BadEventId", "ID_REGEX", "Clock", "bind_port", "free_port", "ConfigError", "DispatcherConfig", "EventId", "EventStoreConfig", "FakeClock",
    "IdGenerator", "JoinConfig", "LatencyHistogram", "JoinerConfig", "LogChunk", "LogTailer", "PhotonConfig", "Quarantine",
    "RegionConfig", "RegistryConfig", "SparkConfig", "VerifyConfig", "S3Config", "InputConfig", "Location", "ObjectGone", "ObjectInfo", "SourceError",
    "SourceUnavailable", "open_source", "stream_source", "output_publisher", "parse_location", "S3Publisher", "read_object_lines",
    "read_stream_json", "stream_lines", "stream_objects", "TIMESTAMP_DIGITS", "LinesLost", "RollingWriter", "DISPATCHER_DIR", "DISPATCHER_STATUS_FILE", "joined_horizon_us", "SystemClock", "describe_options",
    "format_event_id", "id_timestamp_us", "is_event_id", "list_log_files", "load_config", "parse_config", "check_config", "ControlConfig",
    "folder_unmade", "fsync_path", "ID_KEY", "ID_TIME_DIGITS", "key_and_time", "parse_event_id", "parse_record", "OutputSnapshot", "OutputTailer", "output_snapshot", "read_output_lines", "run_service", "settle_gc", "GEN0_THRESHOLD", "METRICS_AFTER_S", "serve_metrics_of", "wait_until", "write_atomic",
    "LockHeld", "hold_lock", "lock_holder",
    "SCHEMES", "OutputReader", "OutputSink", "Source", "StorageKind", "join_location", "local_folder", "open_output_sink",
    "output_reader", "storage_kind", "ObjectPublisher",
    "EventIds", "TIME_FORMATS", "custom_key", "key_id", "parse_event_time",
    "MAX_TIME_US", "check_custom_id",
]
