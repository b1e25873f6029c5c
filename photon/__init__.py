"""Photon's base: event ids, clock, configuration, log reading and writing, join outcomes, process specs.

Every room imports only these names. The base imports no room and never imports grpc or pysyncobj; the
launcher layer that imports the rooms (launcher, supervisor, run summary, generator, the ``photon`` command
line) lives above them in :mod:`photon.app`.
"""
from photon._clock import Clock, FakeClock, SystemClock
from photon._config import (REGION_PORT_SPAN, REGION_PORTS, ConfigError, ControlConfig, DispatcherConfig, EventStoreConfig, JoinConfig, JoinerConfig,
                            PhotonConfig, RegionConfig, RegistryConfig, S3Config, InputConfig, SparkConfig, VerifyConfig, describe_options, load_config,
                            check_config, parse_config, recovery_stream)
from photon._histogram import LatencyHistogram
from photon._ids import (ID_REGEX, TIME_FORMATS, TIMESTAMP_DIGITS, BadEventId, EventId, EventIds, IdGenerator, custom_key,
                         format_event_id, id_timestamp_us, is_event_id, key_id, parse_event_id, parse_event_time,
                         MAX_TIME_US, check_custom_id)
from photon._outcomes import OUTCOMES, Outcome
from photon._tls import TlsFiles, raft_password, raft_secret, secret_fingerprint, tls_env, tls_files, tls_paths, use_tls
from photon._metrics import MetricKinds, NamedHTTPSConnection, histogram_quantile, scrape, serve_metrics
from photon._process import ProcessSpec, region_ports, remembered_ports
from photon._service import bind_port, free_port, run_service
from photon._logs import (LogChunk, Quarantine, list_log_files, parse_record, fsync_path, wait_until,
                          write_atomic)
from photon._writer import LinesLost, RollingWriter
from photon._horizon import DISPATCHER_DIR, DISPATCHER_STATUS_FILE, joined_horizon_us
from photon._output import OutputSnapshot, OutputTailer, output_snapshot, read_output_lines
from photon._source import (Location, ObjectGone, ObjectInfo, SourceError, SourceUnavailable, open_source,
                            parse_location, stream_source)
from photon._tail import LogTailer
from photon._lock import LockHeld, hold_lock, lock_holder
from photon._publish import ObjectPublisher, S3Publisher, output_publisher, read_object_lines
from photon._storage import (SCHEMES, OutputReader, OutputSink, Source, StorageKind, join_location, local_folder,
                             open_output_sink, output_reader, storage_kind)
from photon._spark_io import read_stream_json, stream_lines, stream_objects

__all__ = [
    "OUTCOMES", "Outcome", "recovery_stream", "MetricKinds", "histogram_quantile", "NamedHTTPSConnection", "scrape", "serve_metrics", "TlsFiles", "raft_password", "raft_secret", "secret_fingerprint", "tls_env", "tls_files", "tls_paths", "use_tls", "REGION_PORT_SPAN", "REGION_PORTS", "ProcessSpec", "region_ports", "remembered_ports", "BadEventId", "ID_REGEX", "Clock", "bind_port", "free_port", "ConfigError", "DispatcherConfig", "EventId", "EventStoreConfig", "FakeClock",
    "IdGenerator", "JoinConfig", "LatencyHistogram", "JoinerConfig", "LogChunk", "LogTailer", "PhotonConfig", "Quarantine",
    "RegionConfig", "RegistryConfig", "SparkConfig", "VerifyConfig", "S3Config", "InputConfig", "Location", "ObjectGone", "ObjectInfo", "SourceError",
    "SourceUnavailable", "open_source", "stream_source", "output_publisher", "parse_location", "S3Publisher", "read_object_lines",
    "read_stream_json", "stream_lines", "stream_objects", "TIMESTAMP_DIGITS", "LinesLost", "RollingWriter", "DISPATCHER_DIR", "DISPATCHER_STATUS_FILE", "joined_horizon_us", "SystemClock", "describe_options",
    "format_event_id", "id_timestamp_us", "is_event_id", "list_log_files", "load_config", "parse_config", "check_config", "ControlConfig",
    "fsync_path", "parse_event_id", "parse_record", "OutputSnapshot", "OutputTailer", "output_snapshot", "read_output_lines", "run_service", "wait_until", "write_atomic",
    "LockHeld", "hold_lock", "lock_holder",
    "SCHEMES", "OutputReader", "OutputSink", "Source", "StorageKind", "join_location", "local_folder", "open_output_sink",
    "output_reader", "storage_kind", "ObjectPublisher",
    "EventIds", "TIME_FORMATS", "custom_key", "key_id", "parse_event_time",
    "MAX_TIME_US", "check_custom_id",
]
