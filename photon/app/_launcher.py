"""``photon run``: plans every process of a config, supervises them, and knows when the run caught up.

Every service room plans its own processes (``<room>.plan_processes``): per region the cache servers and
logs stores of the event store,
``[joiner].per_region`` joiners and one dispatcher; the IdRegistry's replicas come from
``idregistry.registry_processes`` (re-planned every second, so replicas of shards added by a reshard are
started too). Rooms keep their ports in ``<state_dir>/ports.json`` so restarts reuse them.
``launcher.json`` in the first region's state dir lists every process with its pid (for operators and
fault tests).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import dispatcher
import eventstore
import idregistry
import joiner
from photon import (ConfigError, LockHeld, PhotonConfig, ProcessSpec, folder_unmade, hold_lock, output_publisher, ports_written_once,
                    storage_kind, stream_source, tls_env)
from photon.app._forkserver import ForkServer, checkout_env, take_early
from photon.app._regions import LAUNCHER_FILE, LAUNCHER_HOLDER, LOCK_FILE, RegionControls, held_by_launcher
from photon.app._supervisor import Supervisor

EXIT_OK, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 3, 130
FORKSERVER_LOG = "forkserver.log"


def plan_region(config: PhotonConfig, region: str, registry_endpoints: list[str]) -> list[ProcessSpec]:
    """A region's service processes, each planned by its own room: the event store, then the joiners
    (given the store's address), then the dispatcher (given the joiners' addresses)."""
    stores = eventstore.plan_processes(config, region)
    caches, logs = eventstore.split_planned(stores)
    joiners = joiner.plan_processes(config, region, eventstore=caches, logstore=logs, registry=registry_endpoints)
    feeders = dispatcher.plan_processes(config, region, joiners=[j.address for j in joiners],
                                        registry=registry_endpoints)
    return stores + joiners + feeders


def child_env(config: PhotonConfig) -> dict:
    """The environment of every process Photon starts: this one's, the config's TLS files, and this
    checkout first on ``PYTHONPATH``."""
    return checkout_env({**os.environ, **tls_env(config)})


def launcher_state_file(config: PhotonConfig, regions: list | None = None) -> Path:
    """``launcher.json`` of the launcher that runs ``regions`` (all: None): in the state dir of the first
    region it runs, so a launcher never writes into another machine's region."""
    return Path(config.region(regions[0]).state_dir if regions else config.regions[0].state_dir) / LAUNCHER_FILE


@dataclass
class RunOptions:
    until_caught_up: bool = False
    timeout_s: float | None = None
    regions: list | None = None          # run only these regions' services (default: all)
    progress_every_s: float = 5.0
    stop_requested: list = field(default_factory=list)
    compact: bool = False                # also run `photon compact` every [compact].every_s


class Launcher:
    """Runs the pipeline of one config until caught up, timed out, or told to stop."""

    def __init__(self, config: PhotonConfig, options: RunOptions, echo=None) -> None:
        self.config = config
        self.options = options
        self.echo = echo or (lambda msg: print(f"photon: {msg}", file=sys.stderr, flush=True))
        state_file = launcher_state_file(config, options.regions)
        env = self._child_env(config)
        log = state_file.parent / "logs" / FORKSERVER_LOG
        self.forkserver = take_early(env, log, self.echo) or ForkServer(env, log, echo=self.echo)
        self.supervisor = Supervisor(state_file.parent / "logs", state_file, env=env, echo=self.echo,
                                     forkserver=self.forkserver)
        self.started_at = time.monotonic()
        self._region_specs: list[ProcessSpec] | None = None
        self.registry_export: Path | None = None     # taken at catch-up (--until-caught-up), see _export_registry
        self.export_error = ""

    @staticmethod
    def _child_env(config: PhotonConfig) -> dict:
        return child_env(config)

    def specs(self) -> list[ProcessSpec]:
        """The registry's replicas (re-planned each call: a reshard adds some) and the regions' services
        (planned once: their ports are fixed for the run). The ports chosen are written (``ports.json``) once
        per state dir, before this returns."""
        with ports_written_once():
            specs = list(idregistry.registry_processes(self.config, self.options.regions))
            if self._region_specs is None:
                region_specs = []
                for region in self.pipeline_regions():
                    endpoints = idregistry.registry_endpoints(self.config, self.options.regions, near=region.name)
                    region_specs += plan_region(self.config, region.name, endpoints)
                self._region_specs = region_specs
        return specs + self._region_specs

    def _token_clearing(self):
        """``photon registry clear-tokens`` every ``[registry].clear_tokens_every_s`` (None when 0 or when
        this launcher runs no pipeline)."""
        from photon.app._tokens import PeriodicTokenClearing
        regions = [r.name for r in self.pipeline_regions()]
        if not self.config.registry.clear_tokens_every_s or not regions:
            return None
        return PeriodicTokenClearing(self.config, self.supervisor.env, self.supervisor.log_dir, self.echo,
                                     regions if self.options.regions else None)

    def regions(self) -> list:
        """The regions this launcher runs (``--region``; default every region of the config)."""
        return [r for r in self.config.regions if self.options.regions is None or r.name in self.options.regions]

    def pipeline_regions(self) -> list:
        """The regions this launcher runs a pipeline for (not ``registry_only``)."""
        return [r for r in self.regions() if not r.registry_only]

    def check_inputs(self) -> None:
        """Name every stream folder that does not exist. Logs may appear later, so this is a warning,
        except with ``until_caught_up``, where catching up on nothing would hide a mistyped path."""
        missing = []
        for region in self.pipeline_regions():
            output_publisher(self.config, region, "joined")   # names a missing bucket, endpoint, credentials
            for key in ("primary_stream", "foreign_stream"):
                stream_source(self.config, region, getattr(self.config.join, key))   # names what is wrong
                folder = region.stream_url(getattr(self.config.join, key))
                if not storage_kind(folder).exists(folder, self.config.s3):
                    missing.append(f"region {region.name}: [join].{key} folder {folder} does not exist "
                                   f"(log_root = {region.log_root})")
        if missing and self.options.until_caught_up:
            raise ConfigError(f"{self.config.path}: " + "; ".join(missing))
        for m in missing:
            self.echo(f"warning: {m}; waiting for it to appear")
        self.make_folders()

    def make_folders(self) -> None:
        """Make every state dir and local output folder this launcher writes, or name the key whose path
        cannot be one (a file in the way, no permission) as a configuration error, before anything starts."""
        wanted = [(r, "state_dir", Path(r.state_dir)) for r in self.regions()]
        for region in self.pipeline_regions():
            key = "state_dir" if "://" in str(region.output_root) else "output_root"   # S3 output stages locally
            wanted += [(region, key, d) for d in (region.joined_dir, region.unjoinable_dir, region.quarantine_dir)]
        bad, named = [], set()
        for region, key, folder in wanted:
            if (region.name, key) in named:
                continue                                # one message per key
            why = folder_unmade(folder)
            if why is not None:
                named.add((region.name, key))
                bad.append(f"region {region.name}: [[regions]].{key} = {getattr(region, key)}: {why}")
                continue
            if not os.access(folder, os.W_OK | os.X_OK):
                named.add((region.name, key))
                bad.append(f"region {region.name}: [[regions]].{key} = {getattr(region, key)}: folder {folder} "
                           f"is not writable by this user")
        if bad:
            raise ConfigError(f"{self.config.path}: " + "; ".join(bad))

    def run(self) -> int:
        """Start everything and supervise; returns the exit code (0 caught up or stopped, 3 timed out).
        Raises :class:`AlreadyRunning` when another launcher runs one of these regions.

        The fork server (:mod:`photon.app._forkserver`) starts once the state dirs are locked, so it
        imports the services' modules while this process plans; every service is then forked from it.
        ``python -m photon.app.cli run`` starts it even earlier, before its own imports
        (:func:`~photon.app._forkserver.start_early`): its log is placed only once the state dirs are
        locked, so a launcher refused for a held region writes nothing there."""
        try:
            return self._run()
        finally:
            self.forkserver.close()      # after the supervisor has stopped its children (a no-op then)

    def _run(self) -> int:
        self.check_inputs()
        self._locks = lock_state_dirs(self.config, self.options.regions)
        self.forkserver.start()
        controls = RegionControls(self.regions(), self.echo)
        controls.apply(self.supervisor)          # a region marked down stays down across launcher restarts
        self.supervisor.ensure(self.specs())
        self.echo(f"started {len(self.supervisor.children)} processes "
                  f"(list with pids: {self.supervisor.state_file})")
        last_plan = last_progress = time.monotonic()
        code = EXIT_OK
        watch = CatchUpWatch(self.config, self.options.regions)
        compaction = None
        if self.options.compact:
            from photon.app._compact import PeriodicCompaction
            # a --region launcher compacts its own regions only, as it clears only their tokens
            compaction = PeriodicCompaction(self.config, self.supervisor.env, self.supervisor.log_dir, self.echo,
                                            [r.name for r in self.pipeline_regions()] if self.options.regions
                                            else None)
        clearing = self._token_clearing()
        endpoints = []
        if any(r.port_base for r in self.regions()):     # (its TLS and HTTP stack imported only when served)
            from photon.app._control import serve_controls
            endpoints = serve_controls(self.config, self.regions(), self.control_status, self._control_wish,
                                       self.echo)
        try:
            while not self.options.stop_requested:
                controls.apply(self.supervisor)
                self.supervisor.poll()
                if compaction is not None:
                    compaction.poll()
                if clearing is not None:
                    clearing.poll()
                if time.monotonic() - last_plan >= 1.0:
                    self.supervisor.ensure(self.specs())
                    last_plan = time.monotonic()
                if time.monotonic() - last_progress >= self.options.progress_every_s:
                    self.echo(watch.progress())
                    last_progress = time.monotonic()
                if self.options.until_caught_up and watch.caught_up(self.supervisor.pid):
                    self.echo("caught up: every complete line is consumed and every event resolved")
                    self._export_registry()
                    break
                if self.options.timeout_s is not None and time.monotonic() - self.started_at > self.options.timeout_s:
                    self.echo(f"timed out after {self.options.timeout_s:.0f} s; not caught up: {watch.lagging}")
                    code = EXIT_TIMEOUT
                    break
                time.sleep(0.05)
            else:
                code = EXIT_INTERRUPTED if self.options.stop_requested[0] == signal.SIGINT else EXIT_OK
        finally:
            for endpoint in endpoints:
                endpoint.stop()
            if compaction is not None:
                compaction.stop()
            if clearing is not None:
                clearing.stop()
            self.echo("stopping (dispatchers, then joiners rolling their output, then event stores and registry)")
            self.supervisor.stop()
        return code


    def _control_wish(self, region: str, down: bool, hard: bool, wait_s: float) -> dict:
        """A wish that came through the control endpoint: written and answered as on this machine."""
        from photon.app._regions import wish_and_wait
        return wish_and_wait(self.config, region, down, hard, wait_s)

    def control_status(self) -> dict:
        """What the control endpoint's ``GET /v1/status`` answers: per region this launcher runs, whether it
        is down on purpose, its processes (pid, role, restarts) and its lost-ids ledger and unrecorded ids."""
        from photon.app._summary import lost_ids, unrecorded_ids
        children = dict(self.supervisor.children)
        held = set(self.supervisor.held_regions)
        regions = {}
        for region in self.regions():
            regions[region.name] = {
                "down": region.name in held,
                "lost": 0 if region.registry_only else len(lost_ids(region)),
                "unrecorded": 0 if region.registry_only else unrecorded_ids(region),
                "processes": {name: {"pid": c.proc.pid if c.proc else None, "role": c.spec.role,
                                     "restarts": c.restarts}
                              for name, c in children.items() if c.spec.region == region.name}}
        return {"launcher_pid": os.getpid(), "regions": regions}

    def joiner_regions(self) -> dict[str, str]:
        """``{address: region}`` of every joiner this launcher runs (the address its tokens start with)."""
        return {spec.address: spec.region for spec in self._region_specs or () if spec.role == "joiner"}

    def _export_registry(self) -> None:
        """At catch-up, while the registry still runs: its export, for reconciling it with the output once the
        joiners have stopped (:mod:`photon.app._reconcile`). A failure is kept in ``export_error``, never
        raised: the run still stops cleanly and its summary says that it could not reconcile."""
        from photon.app._reconcile import reconcile_dir, take_export
        out = reconcile_dir(self.config, self.options.regions) / "export"
        t0 = time.monotonic()
        self.echo("taking the registry export to reconcile the registry with the output")
        try:
            manifest = take_export(self.config, out)
        except Exception as e:  # noqa: BLE001  (any failure: reported in the summary, the run stops cleanly)
            self.export_error = f"the registry export failed: {type(e).__name__}: {e}"
            self.echo(self.export_error)
            return
        self.registry_export = out
        rows = sum(s["rows"] for s in manifest["shards"].values())
        self.echo(f"registry export: {rows} id(s) in {time.monotonic() - t0:.1f} s")


class AlreadyRunning(RuntimeError):
    """Another ``photon run`` (or a verify/recover job that brought the registry up) holds a region's state
    dir; ``held`` says who."""

    def __init__(self, message: str, held: LockHeld | None = None) -> None:
        super().__init__(message)
        self.held = held


def holder_name(held: LockHeld) -> str:
    """``another photon run (pid 7)`` or ``photon verify (pid 7)``."""
    return f"another {LAUNCHER_HOLDER} (pid {held.pid})" if held_by_launcher(held) else held.describe()


def lock_state_dirs(config: PhotonConfig, regions=None, what: str = LAUNCHER_HOLDER, only_existing: bool = False) -> list:
    """Take an exclusive lock on every region's state dir (``launcher.lock``) for the life of this process,
    so two launchers can never run the same region's services (their joiners would share output names),
    and no launcher runs beside a job that started the registry itself (:mod:`photon.app._jobregistry`).
    ``what`` names the holder in the lock file; ``only_existing`` skips regions whose state dir does not
    exist here (a job locks only this machine's regions). Raises :class:`AlreadyRunning` naming the holder."""
    held = []
    for region in config.regions:
        if regions is not None and region.name not in regions:
            continue
        if only_existing and not Path(region.state_dir).is_dir():
            continue
        try:
            held.append(hold_lock(Path(region.state_dir) / LOCK_FILE, what))
        except LockHeld as e:
            for g in held:
                g.close()
            raise AlreadyRunning(f"region {region.name!r} is already run by {holder_name(e)} using "
                                 f"{region.state_dir}; stop it first", e) from None
    return held


class CatchUpWatch:
    """Caught up = every region's running dispatcher reports ``caught_up`` from a scan that started after
    the previous check, twice in a row (so a line that arrived meanwhile is never missed)."""

    def __init__(self, config: PhotonConfig, regions=None) -> None:
        self._read = dispatcher.read_status
        self.regions = config.pipeline_regions_of(regions)
        self._streak = 0
        self._since_us = time.time_ns() // 1000
        self.lagging: list[str] = [r.name for r in self.regions]

    def progress(self) -> str:
        """One line per run: what each region's dispatcher has read and resolved so far."""
        parts = []
        for region in self.regions:
            st = self._read(region.state_dir) or {}
            parts.append(f"{region.name}: read {st.get('events_read', 0)}, joined {st.get('joined', 0)}, "
                         f"unjoinable {st.get('unjoinable', 0)}, waiting {st.get('retry_queue', 0)}, "
                         f"unread {st.get('pending_bytes', 0) / 2**20:.1f} MB"
                         + (f", PAUSED waiting for disk ({st['waiting_for_disk']})" if st.get("waiting_for_disk")
                            else ""))
        return "progress: " + "; ".join(parts)

    def caught_up(self, pid_of) -> bool:
        """``pid_of(process name)``: the pid the launcher runs under that name now (a status written by an
        earlier, killed dispatcher does not count). Never true for a launcher that runs no pipeline (only
        registry replicas): it runs until stopped."""
        if not self.regions:
            return False
        lagging, stale = [], False
        for region in self.regions:
            status = self._read(region.state_dir)
            pid = pid_of(f"{region.name}-dispatcher")
            if status is None or status.get("pid") != pid or status.get("scan_at_us", 0) <= self._since_us:
                stale = True          # no news since the last check: wait for a newer scan
                if status is None or not status.get("caught_up"):
                    lagging.append(region.name)
            elif not status.get("caught_up"):
                lagging.append(region.name)
        self.lagging = lagging
        if lagging:
            self._streak = 0
            self._since_us = time.time_ns() // 1000
            return False
        if stale:
            return False
        self._streak += 1
        self._since_us = time.time_ns() // 1000
        return self._streak >= 2
