"""A topology: named computations, the streams each consumes (with a key extractor per consumer and
stream) and the streams it produces, plus the injectors that bring data in.

Any computation can consume any stream by name. Computations can be added while a runtime runs the
topology (:meth:`millwheel.Runtime.add_computation`); from then on they receive what is produced to
their streams.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from millwheel._model import STRONG, WEAK, Computation, KeyExtractor, default_key


class TopologyError(ValueError):
    """A topology that cannot run; the message names the computation or stream at fault."""


@dataclass(frozen=True)
class ComputationSpec:
    name: str
    factory: Callable[[], Computation]
    consumes: Mapping[str, KeyExtractor]
    produces: tuple[str, ...]


@dataclass(frozen=True)
class InjectorSpec:
    name: str
    factory: Callable[[], object]
    produces: str


@dataclass
class Topology:
    computations: dict[str, ComputationSpec] = field(default_factory=dict)
    injectors: dict[str, InjectorSpec] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _consumers: dict = field(default_factory=dict, repr=False, compare=False)   # stream -> (computations, consumers_of)

    def add_computation(self, name: str, computation: Computation | Callable[[], Computation],
                        consumes: Mapping[str, KeyExtractor | None] | Iterable[str] = (),
                        produces: Iterable[str] = ()) -> "Topology":
        """Add a computation. ``consumes`` maps stream name to key extractor (``None``: the producer's key);
        a plain list of stream names uses the producer's keys. ``computation`` is an instance or a
        zero-argument factory; instances are shared by every worker thread (keep them stateless: state
        belongs in ``ctx.state``)."""
        _check_name(name)
        if not isinstance(consumes, Mapping):
            consumes = {s: None for s in consumes}
        extractors = {s: (fn or default_key) for s, fn in consumes.items()}
        factory = computation if not isinstance(computation, Computation) else (lambda c=computation: c)
        probe = factory()
        if not isinstance(probe, Computation):
            raise TopologyError(f"computation {name!r}: factory returned {type(probe).__name__}, "
                                "not a millwheel.Computation")
        if probe.productions not in (STRONG, WEAK):
            raise TopologyError(f"computation {name!r}: productions must be 'strong' or 'weak', "
                                f"not {probe.productions!r}")
        with self._lock:
            if name in self.computations or name in self.injectors:
                raise TopologyError(f"name {name!r} is already used in this topology")
            self.computations[name] = ComputationSpec(name, factory, extractors, tuple(produces))
            self._consumers.clear()
        return self

    def add_injector(self, name: str, injector: Callable[[], object] | object, produces: str) -> "Topology":
        """Add an injector publishing to stream ``produces``; ``injector`` is an instance or a factory."""
        _check_name(name)
        factory = (lambda i=injector: i) if hasattr(injector, "poll") else injector
        with self._lock:
            if name in self.computations or name in self.injectors:
                raise TopologyError(f"name {name!r} is already used in this topology")
            self.injectors[name] = InjectorSpec(name, factory, produces)
        return self

    def consumers_of(self, stream: str) -> list[tuple[str, KeyExtractor]]:
        """Asked once per production: the answer is kept per stream until a computation is added (or the
        ``computations`` map is changed in size directly)."""
        with self._lock:
            hit = self._consumers.get(stream)
            if hit is not None and hit[0] == len(self.computations):
                return hit[1]
            found = [(c.name, c.consumes[stream]) for c in self.computations.values() if stream in c.consumes]
            self._consumers[stream] = (len(self.computations), found)
            return found

    def producers(self) -> dict[str, list[str]]:
        """For every computation, the names of computations and injectors producing to what it consumes."""
        with self._lock:
            by_stream: dict[str, list[str]] = {}
            for c in self.computations.values():
                for s in c.produces:
                    by_stream.setdefault(s, []).append(c.name)
            for i in self.injectors.values():
                by_stream.setdefault(i.produces, []).append(i.name)
            return {c.name: sorted({p for s in c.consumes for p in by_stream.get(s, [])})
                    for c in self.computations.values()}

    def produces(self, name: str) -> tuple[str, ...]:
        with self._lock:
            if name in self.injectors:
                return (self.injectors[name].produces,)
            return self.computations[name].produces


def _check_name(name: str) -> None:
    if not name or not isinstance(name, str) or "/" in name:
        raise TopologyError(f"bad name {name!r}: a non-empty string without '/'")
