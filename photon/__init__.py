"""Photon's base: event ids, clock, configuration, log reading and writing, join outcomes, process specs.

Every room imports only these names. The base imports no room and never imports grpc or pysyncobj; the
launcher layer that imports the rooms (launcher, supervisor, run summary, generator, the ``photon`` command
line) lives above them in :mod:`photon.app`.
"""
from photon._clock import Clock, FakeClock, SystemClock
from photon._config import (ConfigError, DispatcherConfig, EventStoreConfig, JoinConfig, JoinerConfig,
                            PhotonConfig, RegionConfig, RegistryConfig, SparkConfig, VerifyConfig, describe_options, load_config,
                            parse_config)
from photon._ids import (BadEventId, EventId, IdGenerator, format_event_id, id_timestamp_us,
                         is_event_id, parse_event_id)
from photon._outcomes import OUTCOMES, Outcome
from photon._process import ProcessSpec, remembered_ports
from photon._service import bind_port, free_port, run_service
from photon._logs import (LogChunk, LogTailer, Quarantine, RollingWriter, list_log_files, parse_record,
                          read_output_lines, wait_until, write_atomic)

__all__ = [
    "OUTCOMES", "Outcome", "ProcessSpec", "remembered_ports", "BadEventId", "Clock", "bind_port", "free_port", "ConfigError", "DispatcherConfig", "EventId", "EventStoreConfig", "FakeClock",
    "IdGenerator", "JoinConfig", "JoinerConfig", "LogChunk", "LogTailer", "PhotonConfig", "Quarantine",
    "RegionConfig", "RegistryConfig", "SparkConfig", "VerifyConfig", "RollingWriter", "SystemClock", "describe_options",
    "format_event_id", "id_timestamp_us", "is_event_id", "list_log_files", "load_config", "parse_config",
    "parse_event_id", "parse_record", "read_output_lines", "run_service", "wait_until", "write_atomic",
]
