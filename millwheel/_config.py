"""Runtime configuration: every option declared once, typed, with a default and a docstring."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from millwheel._store import SCHEMES


class MillWheelConfigError(ValueError):
    """An unknown option or a bad value; the message names the option."""


@dataclass(frozen=True)
class RuntimeConfig:
    store: str = "sqlite:///millwheel-state.db"
    """State store URL: ``sqlite:///relative.db`` / ``sqlite:////absolute.db`` (durable, one process; the
    default here), ``postgresql://user@host:port/db`` (shared by every worker; ``millwheel run`` starts an
    embedded one by default) or ``memory://`` (nothing survives the process; for tests)."""
    threads: int = 2
    """Worker threads; key intervals are spread over them."""
    intervals: int = 16
    """Key intervals per computation (``mmh3(key) mod intervals``); each has one writer and a sequencer."""
    max_batch: int = 1000
    """Most deliveries a worker takes into one batch (one store transaction)."""
    max_in_flight: int = 20000
    """Most unacked productions an injector keeps outstanding before it waits (backpressure). Over a
    transport that retries (worker processes) it keeps fewer: about what its consumers ack in a quarter of
    ``retry_delay_us``, at least the larger of ``injector_batch`` and 1,000 (``AckPace``), and it also waits
    while its oldest unacked production is older than half of ``retry_delay_us``."""
    injector_batch: int = 2000
    """Most records an injector reads per poll."""
    retry_delay_us: int = 2_000_000
    """A delivery not acked within this delay is sent again."""
    weak_checkpoint_delay_us: int = 100_000
    """A weak production not acked within this delay is checkpointed so the input can be acked."""
    dedup_retention_us: int = 600_000_000
    """Dedup ids are kept at least this long after production, and until no sender can retry them."""
    gc_interval_us: int = 5_000_000
    """How often dedup ids are garbage collected and watermarks persisted."""
    tick_us: int = 5_000
    """How often watermarks are recomputed and due timers looked for when nothing else happens while a
    worker has work waiting (a commit in flight, records waiting for their key, weak checkpoints); a worker
    with none waits until its earliest processing-time timer, at most 100 ms, as anything else that gives it
    work wakes it. Also how long an injector waits before polling again after an empty poll that followed
    one with records."""
    cache_keys: int = 100_000
    """State cache size in keys: each worker's interval cores share it for each computation (split evenly
    over the intervals it holds), and the framework cache in front of the store (one per process; keys with
    a pending timer are kept beyond it) holds as many."""
    max_attempts: int = 5
    """Attempts of user code on one record before the record is set aside (stored with its key, the error
    and the attempts, see ``Store.set_aside_records``) and the key's other records go on without it."""
    bloom_capacity: int = 1_000_000
    """Ids per computation's dedup Bloom filters, split evenly over its intervals (one filter per interval,
    at least 1024 ids); a full filter is rebuilt from the store."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise MillWheelConfigError(f"millwheel option {f.name!r} must be a positive integer, "
                                           f"not {value!r}")
        if not isinstance(self.store, str) or not self.store.startswith(tuple(SCHEMES)):
            raise MillWheelConfigError(f"millwheel option 'store' must be a {', '.join(SCHEMES)} URL, "
                                       f"not {self.store!r}")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> "RuntimeConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise MillWheelConfigError(f"unknown millwheel option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)
