"""The master's client: finds the leader (following redirects), retries through tenacity, reads the
interval map from any replica. Thread-safe.

Every retry is idempotent: a registration carries one id for all its attempts (a retried RPC whose reply
was lost is the same incarnation, not a new one), and a heartbeat only restarts a lease.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import grpc
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, stop_when_event_set, wait_exponential_jitter

from photon.rpc import open_channel

from millwheel import master_pb2 as pb
from millwheel import master_pb2_grpc as pb_grpc
from millwheel._master import interval_from_pb, new_registration
from millwheel._master_state import Interval, WorkerLoad

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.min_reconnect_backoff_ms", 50)]


class MasterUnavailable(Exception):
    """No replica answered (or no leader was found) within the client's retry budget."""


class _Retry(Exception):
    pass


@dataclass(frozen=True)
class Assignments:
    """What the master told a worker: ``known`` False means its incarnation is not registered (any more):
    it owns nothing and must register again. ``intervals`` is everything it owns now, each with its
    sequencer; ``lease_us`` is the lease's length (the worker stops using them at the time it *sent* this
    request plus ``lease_us``, on its own clock, unless a later heartbeat succeeded)."""
    worker: str
    known: bool
    incarnation: int
    lease_until_us: int
    lease_us: int
    intervals: tuple[Interval, ...]


def _assignments(worker: str, reply) -> Assignments:
    return Assignments(worker, reply.known, reply.incarnation, reply.lease_until_us, reply.lease_us,
                       tuple(interval_from_pb(m) for m in reply.intervals))


def load_to_pb(load: WorkerLoad) -> pb.Load:
    return pb.Load(cpu=load.cpu, queue=load.queue, intervals=[
        pb.IntervalLoad(computation=r.computation, lo=r.lo, sequencer=r.sequencer, records_per_s=r.records_per_s,
                        split_key=r.split_key) for r in load.intervals])


class MasterClient:
    """``MasterClient(["host:port", ...])``: the master replicas' gRPC addresses. Each call retries (with
    jittered exponential back-off) for up to ``retry_timeout_s`` before raising :class:`MasterUnavailable`.
    ``stopping``: once set (its process is stopping), a call is not tried again and a wait between
    attempts ends at once (except a leave, :meth:`heartbeat` with ``leaving``, which has its own budget);
    :meth:`interrupt` also cuts off the calls in progress."""

    def __init__(self, endpoints: list[str], retry_timeout_s: float = 15.0, rpc_timeout_s: float = 3.0,
                 stopping: threading.Event | None = None) -> None:
        if not endpoints:
            raise ValueError("MasterClient needs at least one master address")
        self.endpoints = list(endpoints)
        self._stopping = stopping or threading.Event()
        self._interrupted = False
        self.retry_timeout_s = retry_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._stubs: dict[str, pb_grpc.MasterStub] = {}
        self._channels: list[grpc.Channel] = []
        self._lock = threading.Lock()
        self._leader = ""
        self.retries = 0
        self.redirects = 0

    def _stub(self, address: str) -> pb_grpc.MasterStub:
        with self._lock:
            self._check_interrupted()
            stub = self._stubs.get(address)
            if stub is None:
                channel = open_channel(address, CHANNEL_OPTIONS)
                self._channels.append(channel)
                stub = self._stubs[address] = pb_grpc.MasterStub(channel)
            return stub

    def _retrying(self, attempt, budget_s: float | None = None, interruptible: bool = True):
        stop = stop_after_delay(self.retry_timeout_s if budget_s is None else budget_s)
        never = threading.Event()
        stopping = self._stopping if interruptible else never
        retrying = Retrying(stop=stop | stop_when_event_set(stopping), reraise=True, sleep=stopping.wait,
                            wait=wait_exponential_jitter(multiplier=0.05, max=0.5, jitter=0.05),
                            retry=retry_if_exception_type(_Retry))
        try:
            for n, tried in enumerate(retrying):
                if n:
                    self.retries += 1
                with tried:
                    return attempt()
        except _Retry as e:
            raise MasterUnavailable(str(e)) from None

    # ---- writes: the leader ----

    def _to_leader(self, call, deadline: float | None = None):
        """One round over the replicas, leader first, following redirects; ``_Retry`` when none decided.
        ``call(stub, timeout_s)``: each call's timeout is ``rpc_timeout_s``, or what is left before ``deadline``
        (``time.monotonic()``) when that is less (none is made once it has passed)."""
        order = ([self._leader] if self._leader else []) + [a for a in self.endpoints if a != self._leader]
        tried, errors = set(), []
        while order:
            address = order.pop(0)
            if address in tried:
                continue
            timeout_s = self.rpc_timeout_s
            if deadline is not None:
                timeout_s = min(timeout_s, deadline - time.monotonic())
                if timeout_s <= 0:
                    errors.append("no time left for the others")
                    break
            tried.add(address)
            try:
                reply = call(self._stub(address), timeout_s)
            except ValueError:      # a channel closed under the call
                self._check_interrupted()
                raise
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE:
                    raise
                errors.append(f"{address}: {e.code().name}")
                continue
            if reply.redirect:
                self.redirects += 1
                if reply.redirect != "?":
                    order.insert(0, reply.redirect)
                errors.append(f"{address}: not the leader")
                continue
            self._leader = address
            return reply
        self._leader = ""
        raise _Retry(f"no master leader answered ({'; '.join(errors)})")

    def register(self, worker: str, address: str, registration: str | None = None) -> Assignments:
        """Register a worker process (one ``registration`` id per process start; made here when omitted)."""
        req = pb.RegisterRequest(worker=worker, address=address, registration=registration or new_registration())
        reply = self._retrying(lambda: self._to_leader(
            lambda stub, timeout_s: stub.RegisterWorker(req, timeout=timeout_s)))
        return _assignments(worker, reply)

    def heartbeat(self, worker: str, incarnation: int, load: WorkerLoad | None = None,
                  leaving: bool = False, budget_s: float | None = None) -> Assignments:
        """Restart the lease of ``worker``'s incarnation (and report its load); everything it owns now.
        ``leaving``: the incarnation leaves (its intervals move at once); tried also while stopping.
        ``budget_s``: every attempt and every call ends within that many seconds of this call (a round over
        replicas that accept connections but do not answer, e.g. replicas stopping at the same moment,
        cannot take a call's full timeout per replica)."""
        req = pb.HeartbeatRequest(worker=worker, incarnation=incarnation, leaving=leaving)
        if load is not None:
            req.load.CopyFrom(load_to_pb(load))
        deadline = None if budget_s is None else time.monotonic() + budget_s
        reply = self._retrying(lambda: self._to_leader(lambda stub, timeout_s: stub.Heartbeat(req, timeout=timeout_s),
                                                       deadline),
                               budget_s, interruptible=not leaving)
        return _assignments(worker, reply)

    # ---- reads: any replica ----

    def _any(self, call, addresses: list[str] | None = None):
        errors = []
        for address in addresses or ([self._leader] if self._leader else []) + \
                [a for a in self.endpoints if a != self._leader]:
            try:
                return call(self._stub(address))
            except ValueError:
                self._check_interrupted()
                raise
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE:
                    raise
                errors.append(f"{address}: {e.code().name}")
        raise _Retry(f"no master replica answered ({'; '.join(errors)})")

    def interval_map(self, computation: str = "", address: str | None = None) -> list[Interval]:
        """The map of ``computation`` ("": every one) from the first replica that answers (``address``:
        from that one), in key order. A follower's copy may lag the leader's."""
        req = pb.IntervalMapRequest(computation=computation)
        reply = self._retrying(lambda: self._any(lambda stub: stub.GetIntervalMap(req, timeout=self.rpc_timeout_s),
                                                 [address] if address else None))
        return [interval_from_pb(m) for m in reply.intervals]

    def status(self) -> list[dict]:
        """Every replica's statistics (``{"address": ..., "error": ...}`` for one that does not answer)."""
        out = []
        for address in self.endpoints:
            try:
                reply = self._stub(address).Status(pb.StatusRequest(), timeout=self.rpc_timeout_s)
                out.append(json.loads(reply.status_json))
            except grpc.RpcError as e:
                out.append({"address": address, "error": e.code().name})
        return out

    def _check_interrupted(self) -> None:
        if self._interrupted:
            raise MasterUnavailable("the master client was interrupted: its process is stopping")

    def interrupt(self) -> None:
        """Cut off the calls in progress (each raises :class:`MasterUnavailable`) and refuse new ones."""
        with self._lock:
            self._interrupted = True
        self.close()

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()
