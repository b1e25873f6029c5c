"""Starting and stopping a joiner: gRPC server, output writer with its roll thread, and its clients."""
from __future__ import annotations

import logging
import re
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from eventstore import connect as connect_eventstore
from photon import (Clock, is_event_id, ConfigError, MetricKinds, PhotonConfig, RollingWriter, SystemClock, bind_port,
                    open_output_sink)

from joiner import joiner_pb2_grpc as pb_grpc
from photon.rpc import HEALTH_POLL_S, Health, add_health, server_credentials
from joiner._adapter import load_adapter
from joiner._client import CHANNEL_OPTIONS
from joiner._lost import LostLedger
from joiner._shell import Joiner, JoinerStatistics
from joiner._servicer import JoinerServicer
from joiner._status import STATUS_INTERVAL_S, status_path, write_status

log = logging.getLogger("photon.joiner")

EXTRA_SERVER_THREADS = 4
"""Threads beyond ``max_in_flight``: they answer requests over the limit THROTTLED at once."""

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")

METRIC_KINDS = MetricKinds(
    gauges=frozenset({"in_flight", "max_in_flight"}),
    counters=frozenset({
        "requests", "requests_throttled", "events", "joined", "already_registered", "not_found", "throttled",
        "unjoinable", "duplicates_in_request", "adapter_errors", "bad_ids", "eventstore_errors", "registry_errors",
        "commit_retries", "lines_written", "bytes_written", "files_rolled", "orphans_recovered",
        "not_found_store_behind", "served_by_cache", "served_by_logs", "write_failures", "lost_ids",
        "requests_throttled_writer", "refused_ids", "commit_unknown_ids", "unrecorded_ids", "output_commits",
        "store_wait_us", "commit_wait_us", "write_wait_us"}))
"""How :class:`JoinerStatistics` is exposed: everything counts since the process started, but the
requests in flight and their limit."""


class JoinerServer:
    """A running joiner; :attr:`address` is ``host:port`` as bound.

    A background thread rolls the output file on time, rewrites the status file (see
    :func:`joiner.read_status`) about once a second, and keeps the gRPC health (:attr:`health`) following
    :meth:`serving_problem`. :meth:`stop` is the clean shutdown: stop accepting
    requests, let those in flight finish their commits and writes (:meth:`Joiner.drain`,
    within ``[joiner].stop_patience_s``; what is still unfinished then goes into the lost-ids ledger), roll
    (publish) the output file, write the final status, close the clients this server opened.
    """

    def __init__(self, joiner: Joiner, server: grpc.Server, writer: RollingWriter, host: str, port: int,
                 owned: list, status_file: Path, clock: Clock, stop_patience_s: float = 15.0,
                 health: Health | None = None) -> None:
        self.joiner = joiner
        self.health = health
        self.metric_kinds = METRIC_KINDS
        self._refused_before = 0
        self.host, self.port, self.address = host, port, f"{host}:{port}"
        self._server = server
        self._writer = writer
        self._owned = owned
        self._status_file = status_file
        self._clock = clock
        self._stop_patience_s = stop_patience_s
        self._stop = threading.Event()
        # every request syncs its own lines (a group commit), so the roller only rolls on time, retries
        # publishing and commits anything written but not committed yet: ten times per roll interval, at
        # most every 100 ms (not five times per commit interval: 100 wake-ups a second for nothing)
        period = min(writer.roll_interval_s / 10, 0.1)
        self._roller = threading.Thread(target=self._roll_loop, args=(period,), name=f"{joiner.name}-roller",
                                        daemon=True)
        self._roller.start()

    def _roll_loop(self, period: float) -> None:
        next_status = next_health = 0.0
        while not self._stop.wait(period):
            try:
                self._writer.maybe_roll()
            except Exception:
                log.exception("joiner %s: rolling the output file failed", self.joiner.name)
            if self.health is not None and time.monotonic() >= next_health:
                next_health = time.monotonic() + HEALTH_POLL_S
                self.health.update(self.serving_problem())
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + STATUS_INTERVAL_S
                self._write_status()

    def _write_status(self) -> None:
        try:
            write_status(self._status_file, self.joiner.statistics(), self._clock.now_us())
        except OSError:
            log.exception("joiner %s: writing %s failed", self.joiner.name, self._status_file)

    def statistics(self) -> JoinerStatistics:
        return self.joiner.statistics()

    def serving_problem(self) -> str | None:
        """Why the joiner should not be sent requests now (None: it can take them): its output writes
        fail (the output folder is probed again, as the joiner does at its door), or it is throttled (every request slot busy now, or a request refused at the door since the
        last call). Called from the roll thread about every :data:`photon.rpc.HEALTH_POLL_S`."""
        st = self.joiner.statistics()
        refused = st.requests_throttled + st.requests_throttled_writer
        refused_since, self._refused_before = refused - self._refused_before, refused
        # a failing writer is probed here too (at most once per writer_probe_s), not only when a request
        # comes: a joiner taken out of rotation for its health must be able to come back without traffic
        if st.writer_error and not self.joiner._writer_usable():
            return f"output writes fail: {st.writer_error}"
        if st.in_flight >= st.max_in_flight:
            return f"throttled: all {st.max_in_flight} request slots busy"
        if refused_since > 0:
            return f"throttled: {refused_since} request(s) refused since the last check"
        return None

    def stop(self, grace: float | None = None) -> None:
        """``grace``: how long requests in flight may take (default ``[joiner].stop_patience_s``)."""
        if self.health is not None:
            self.health.stopping()
        patience = self._stop_patience_s if grace is None else grace
        stopped = self._server.stop(patience + 2.0)   # refuse new requests; RPCs in flight are answered
        unfinished = self.joiner.drain(patience)
        if unfinished:
            log.error("joiner %s: stopped with %d commit(s) unfinished after %.1f s; their ids are in the "
                      "lost-ids ledger", self.joiner.name, unfinished, patience)
        stopped.wait(3.0)
        self._stop.set()
        self._roller.join(timeout=10)
        self._writer.roll()
        self._write_status()
        for client in self._owned:
            try:
                client.close()
            except Exception:
                log.exception("joiner %s: closing %r failed", self.joiner.name, client)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)


def serve(config: PhotonConfig, region: str, name: str, *, eventstore, registry, port: int = 0,
          host: str | None = None, clock: Clock | None = None, logstore=()) -> JoinerServer:
    """Start joiner ``name`` of ``region`` on ``host:port`` (default ``[joiner].host``; port 0 picks one).

    ``eventstore`` is the region's cache servers' addresses (``host:port``, comma-separated, in plan order)
    or an object with ``lookup(ids)`` (e.g. :class:`eventstore.InMemoryEventStore`); ``logstore`` the logs
    stores' addresses, asked for what the cache servers missed (see :class:`eventstore.EventStoreChain`); ``registry`` is registry endpoints (a list, a comma-separated
    string, or ``memory://``) or an object with ``commit(ids, token)``. Clients made here are closed by
    :meth:`JoinerServer.stop`. Output goes to ``<output_root>/joined/date=D/hour=H/<name>-*.jsonl`` (README
    "Output contract"); in-progress files a
    killed predecessor of the same name left are published first, so only one process per name may run.
    Statistics also go to ``<state_dir>/joiners/<name>.json``. Raises ConfigError (bad name, region or
    adapter) or OSError (port not free).
    """
    if not _NAME.match(name):
        raise ConfigError(f"joiner name must be letters, digits, - and _, got {name!r}")
    reg = config.region(region)
    jc = config.joiner
    adapter = load_adapter(jc.adapter, reg.name, name, config.join.nest_primary_as)
    clock = clock or SystemClock()
    host = host or jc.host
    server = grpc.server(futures.ThreadPoolExecutor(jc.max_in_flight + EXTRA_SERVER_THREADS, thread_name_prefix=name),
                         options=CHANNEL_OPTIONS)
    bound = bind_port(server, host, port, f"joiner {name}", server_credentials())
    store, registry, owned = _open_clients(eventstore, registry, logstore, config.eventstore.ring_vnodes)
    writer = open_output_sink(reg.output_url("joined"), name, staging=reg.joined_dir, s3=config.s3,
                              roll_interval_s=jc.roll_interval_s, roll_bytes=int(jc.roll_mb * (1 << 20)),
                              commit_interval_s=jc.commit_interval_ms / 1000, clock=clock)
    token_host = host if host not in ("0.0.0.0", "::", "[::]") else socket.gethostname()
    joiner = Joiner(name=name, address=f"{token_host}:{bound}", store=store, registry=registry,
                    adapter=adapter, writer=writer, max_in_flight=jc.max_in_flight, clock=clock,
                    commit_patience_s=jc.commit_patience_s, store_behind_s=jc.store_behind_s,
                    ledger=LostLedger(reg.state_dir, reg.name, name), writer_probe_s=jc.writer_probe_s,
                    ref_ok=_ref_ok(config.join.primary_ids))
    foreign = config.join.foreign_ids
    joiner.recover_orphans(foreign if foreign.custom else foreign.id_field)   # the ledger holds Photon keys
    pb_grpc.add_JoinerServicer_to_server(JoinerServicer(joiner), server)
    health = add_health(server, "photon.Joiner")     # updated from the server's roll thread
    server.start()
    return JoinerServer(joiner, server, writer, host, bound, owned, status_path(reg.state_dir, name), clock,
                        stop_patience_s=jc.stop_patience_s, health=health)


def _open_clients(eventstore, registry, logstore=(), vnodes: int = 64) -> tuple[object, object, list]:
    """The event store and registry clients (made from addresses when given addresses) and those made."""
    owned: list = []
    if isinstance(eventstore, (str, list)):
        eventstore = connect_eventstore(eventstore, logstore, vnodes)
        owned.append(eventstore)
    if isinstance(registry, (str, list)):
        from idregistry import connect  # here, so that joiner clients never load the registry
        try:
            registry = connect(registry)
        except BaseException:
            for client in owned:
                client.close()
            raise
        owned.append(registry)
    return eventstore, registry, owned


def _ref_ok(primary_ids):
    """Which ref ids can name a primary event: Photon ids, or (with a primary time field) custom ids."""
    if not primary_ids.custom:
        return is_event_id
    return lambda ref: primary_ids.ref_problem(ref) is None
