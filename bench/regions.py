"""Two regions at a distance: ``python -m bench.regions [--rtts 0,30,100] [--rate R] [--json]``.

For each round trip, regions a and b run the pipeline and c hosts registry replicas only (5 replicas as
2/2/1), each region started by its own ``photon run --region`` in its own network namespace, any two
regions ``rtt`` apart: every packet between two namespaces (TCP handshakes, gRPC, Raft) is delayed by half
the round trip each way, by ``tc netem`` where the kernel has it, else by the TUN relay of
:mod:`bench.netns` (``distance`` says which; the relay carries the 0 ms run too, so the runs differ only
in the delay). Where namespaces are refused, every region runs on this host's loopback and the registry's
``simulated_rtt_ms`` delays the messages between replicas only (``distance`` says so).

The bench writes both regions' copies of the logs itself (ten queries per click, queries first), to a
running deployment, in phases:

1. start-up: a probe click, until it is joined (``startup_s``; not in any rate);
2. backlog: ``--backlog`` clicks written at once; clicks joined per second until every one is in the
   union of both regions' output (``backlog_clicks_joined_per_s``: what the deployment can drain);
3. steady: ``--seconds`` of ``--rate`` clicks per second; ``clicks_joined_per_s`` is the steady clicks
   divided by the real time from the first being written to the last being visible (union; paced, so
   about the rate asked), and the join latency ``join_p50_ms``... runs from a click's line being complete
   in both copies to its joined line being visible in either region's output to a reader following the
   output contract (published files and the committed prefix of open ones, :class:`photon.OutputTailer`
   in a follower outside the pipeline, :mod:`bench._output`: ``bench.pipeline``'s ``published_p50_ms``).
   ``flushed_p50_ms``... stop the clock earlier, at the first flush of the line into any file, hidden
   in-progress files included (what a reader of the contract cannot see yet). At the end of the phase
   the bench waits until both dispatchers have caught up and takes the wasted joins so far:
   ``wasted_joins`` (clicks sent to a joiner whose commit found them already registered, both regions)
   over the ``both_up_clicks`` written while both regions were up (start-up, backlog and steady phases),
   ``wasted_joins_fraction``;
4. outage: region b taken down whole (SIGKILL, its 2 registry replicas too) while writing goes on at
   ``--rate`` for ``--outage-s`` (region a joins everything alone), writing stops, b comes back:
   ``catch_up_s`` is the time until b's new dispatcher has read its whole copy and resolved every click;
   ``outage_join_p50_ms``/``p99``: visible latency of the clicks written during the outage (region a alone),
   ``outage_b_share_...``: of those that the share gave b before the outage (what a holds back for b until
   it judges b down, or until it sees the registry leader move to a): p50, max, and p50 over the outage's
   first seconds;
   ``outage_a_judged_b_down``: how often a judged b down;
   ``outage_wasted_joins``: wasted joins during the outage and b's catch-up (not in the fraction above).

Also per round trip: registry ids per replicated command (leaders' counters) and the region of the
shard leader (at the end of the steady phase), each dispatcher's own join latency p50 (from reading a
click to its joiner's answer, over its latest joins: the region far from the leader pays more), and
duplicates in the union (must be 0). At the end: whether the targets hold at the largest round trip
against 0 ms (``target_throughput_met``: the unpaced backlog drain, ``backlog_clicks_joined_per_s``, at
least 80% of the 0 ms figure, ``throughput_ratio_far_vs_0ms``; the steady phase is paced, so its rate
says only that the offered load was carried; ``target_latency_met``: the visible p50 within the round
trip plus 50 ms of the 0 ms p50).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from bench._common import emit, percentile, stop_groups
from bench._output import OutputFollower
from bench.netns import RegionNetwork, delay_kind, namespaces_refused
from bench.pipeline import Writer
from photon import REGION_PORT_SPAN, load_config, read_output_lines, scrape, wait_until

PIPELINE = ("a", "b")
ORPHAN_WINDOW_S = 5
"""The outage's first seconds, over which the latency of b's orphaned share is also reported."""
REGIONS = ("a", "b", "c")


def _write_config(root: Path, hosts: dict | None, simulated_rtt_ms: float, joiners: int,
                  settings: dict[str, dict[str, str]]) -> Path:
    base = 10_000 + (os.getpid() % 7) * 3 * REGION_PORT_SPAN     # below the ephemeral ports (32768 on)
    sections: dict[str, dict[str, str]] = {"join": {"unjoinable_after_s": "60"}, "joiner": {"per_region": str(joiners)}}
    if simulated_rtt_ms:
        sections["registry"] = {"simulated_rtt_ms": str(simulated_rtt_ms)}
    for section, values in settings.items():
        sections.setdefault(section, {}).update(values)
    parts = [line for section, values in sections.items()
             for line in [f"[{section}]", *(f"{k} = {v}" for k, v in values.items())]]
    for i, name in enumerate(REGIONS):
        parts += ["[[regions]]", f'name = "{name}"', f'state_dir = "{name}/state"', f"port_base = {base + i * REGION_PORT_SPAN}"]
        parts += ['registry_only = true'] if name not in PIPELINE else [f'log_root = "{name}/logs"',
                                                                        f'output_root = "out/{name}"']
        if hosts:
            parts.append(f'host = "{hosts[name]}"')
    path = root / "photon.toml"
    path.write_text("\n".join(parts) + "\n")
    return path


class Copies(Writer):
    """:class:`bench.pipeline.Writer` appending the same lines to every region's copy of the logs; a
    click's written time is taken once its line is complete in every copy."""

    def __init__(self, roots: list[Path]) -> None:
        super().__init__(roots[0])
        self.copies = [(self.q, self.c)] + [
            ([open(self._path(r, "queries", w), "ab", buffering=0) for w in range(len(self.q))],
             [open(self._path(r, "clicks", w), "ab", buffering=0) for w in range(len(self.c))]) for r in roots[1:]]

    def write(self, formatted) -> None:
        qdata, cdata, cids = formatted
        for q, _ in self.copies:
            for f, data in zip(q, qdata):
                f.write(data)
        stamp = str(time.time_ns() // 1000).encode()
        stamped = [data.replace(b"WRITTEN", stamp) for data in cdata]
        for _, c in self.copies:
            for f, data in zip(c, stamped):
                f.write(data)
        done = time.time_ns() // 1000
        for ids in cids:
            for cid in ids:
                self.written_us[cid] = done


class Pacer(threading.Thread):
    """Writes ``rate`` clicks per second (in 50 batches a second) until stopped."""

    def __init__(self, writer: Copies, rate: int) -> None:
        super().__init__(daemon=True)
        self.writer, self.rate, self.stopped = writer, rate, threading.Event()
        self.began = self.ended = 0.0

    def run(self) -> None:
        per_tick = max(1, self.rate // 50)
        self.began = next_t = time.monotonic()
        while not self.stopped.is_set():
            self.writer.batch(per_tick)
            next_t += per_tick / self.rate
            self.stopped.wait(max(0.0, next_t - time.monotonic()))   # pacing the load, not a condition
        self.ended = time.monotonic()


class Joined:
    """Counts joined lines over both regions' output; published files never change, so each is read once
    (the bench must not steal the pipeline's CPU by re-reading its output)."""

    def __init__(self, config) -> None:
        self.dirs = [r.joined_dir for r in config.pipeline_regions]
        self.id_field = config.join.foreign_id_field
        self._published: dict[Path, int] = {}

    def count(self) -> int:
        total = 0
        for d in self.dirs:
            for p in Path(d).rglob("*.jsonl*"):
                if p.name.endswith(".jsonl"):
                    if p not in self._published:
                        self._published[p] = p.read_bytes().count(b"\n")
                    total += self._published[p]
                else:
                    try:
                        total += p.read_bytes().count(b"\n")
                    except FileNotFoundError:      # published meanwhile: counted on the next call
                        return self.count()
        return total

    def duplicates(self) -> int:
        ids = [orjson.loads(x)[self.id_field] for d in self.dirs for x in read_output_lines(d, include_inprogress=True)]
        return len(ids) - len(set(ids))


def _start(config_path: Path, region: str, prefix: list, log: Path) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-m", "photon.app.cli", "run", "--config", str(config_path),
                             "--region", region], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _status(config, region: str) -> dict:
    from dispatcher import read_status
    return read_status(config.region(region).state_dir) or {}


def _registry_leaders(config) -> tuple[float, str]:
    """The leaders' mean ids per replicated command, and the regions the shard leaders are in."""
    commands = ids = 0
    where = []
    for name in REGIONS:
        try:
            procs = orjson.loads((Path(config.region(name).state_dir) / "launcher.json").read_bytes())["processes"]
        except (OSError, ValueError, KeyError):
            continue
        for p in procs.values():
            m = scrape(p["metrics"]) if p.get("role") == "registry" and p.get("metrics") else None
            if m and m.get("photon_registry_is_leader"):
                commands += m.get("photon_registry_commands_total", 0)
                ids += m.get("photon_registry_ids_committed_total", 0)
                where.append(name)
    return (round(ids / commands, 1) if commands else 0.0), ",".join(where)


def _both_caught_up(config, since_us: int) -> bool:
    """Both dispatchers report caught up from a scan that began after ``since_us``."""
    for n in PIPELINE:
        st = _status(config, n)
        if not st.get("caught_up") or st.get("scan_at_us", 0) <= since_us:
            return False
    return True


def _wasted_joins(config) -> int:
    return sum(_status(config, n).get("wasted_joins", 0) for n in PIPELINE)


class Following:
    """An :class:`OutputFollower` of both regions' output polled by a thread while ``--rate`` clicks per
    second are written for ``seconds``; :meth:`run` returns the clicks written, once all are visible."""

    def __init__(self, root: Path, writer: Copies) -> None:
        self.writer = writer
        self.follower = OutputFollower(root / "out")
        self.follower.poll()                         # what is there already: read now, not timed

    def run(self, rate: int, seconds: float, timeout: float, before_wait=None) -> tuple[list[str], "Pacer"]:
        first = len(self.writer.click_ids)
        pacer = Pacer(self.writer, rate)
        pacer.start()
        stop_follow = threading.Event()

        def follow() -> None:
            while not stop_follow.wait(0.002):
                self.follower.poll()
        following = threading.Thread(target=follow, daemon=True)
        following.start()
        time.sleep(seconds)                          # the phase's length: load is being offered
        pacer.stopped.set()
        pacer.join()
        written = self.writer.click_ids[first:]
        try:
            wait_until(lambda: all(c in self.follower.published_us for c in written), timeout, interval=0.1,
                       message="the phase's clicks visible in the output")
        finally:
            stop_follow.set()
            following.join(timeout=10)
        return written, pacer

    def visible_ms(self, ids) -> list[float]:
        w, published = self.writer.written_us, self.follower.published_us
        return [(published[c] - w[c]) / 1000 for c in ids]


def _steady(root: Path, writer: Copies, config, args) -> dict:
    """Phase 3: ``--rate`` clicks/s for ``--seconds``; clicks joined/s and join latency (union) to the joined
    line being visible under the output contract; then the wasted joins of the clicks written so far."""
    following = Following(root, writer)
    steady, pacer = following.run(args.rate, args.seconds, args.timeout)
    follower = following.follower
    w = writer.written_us
    visible = [(follower.published_us[c] - w[c]) / 1000 for c in steady]
    # a line published between two polls was never seen in a hidden file: its first sight is its publication
    flushed = [(follower.seen_us.get(c, follower.published_us[c]) - w[c]) / 1000 for c in steady]
    last_visible_us = max(follower.published_us[c] for c in steady)
    first_written_us = min(w[c] for c in steady)
    figures = {"offered_clicks_per_s": round(len(steady) / (pacer.ended - pacer.began), 1),
               "clicks_joined_per_s": round(len(steady) / ((last_visible_us - first_written_us) / 1e6), 1),
               "steady_clicks": len(steady),
               "join_p50_ms": round(percentile(visible, 50), 1), "join_p90_ms": round(percentile(visible, 90), 1),
               "join_p99_ms": round(percentile(visible, 99), 1),
               "flushed_p50_ms": round(percentile(flushed, 50), 1),
               "flushed_p90_ms": round(percentile(flushed, 90), 1)}
    figures["registry_ids_per_command"], figures["registry_leader_region"] = _registry_leaders(config)
    for n in PIPELINE:      # each dispatcher's own view: first read -> joiner's answer, its last joins
        figures[f"dispatcher_{n}_join_p50_ms"] = _status(config, n).get("join_latency_ms", {}).get("p50")
    written_us = max(w.values())
    wait_until(lambda: _both_caught_up(config, written_us), args.timeout, interval=0.05,
               message="both dispatchers caught up on the clicks written while both regions were up")
    figures["wasted_joins"] = _wasted_joins(config)
    figures["both_up_clicks"] = len(writer.click_ids)
    for n in PIPELINE:      # where the wasted joins come from (see dispatcher/_share.py)
        st = _status(config, n)
        figures[f"share_{n}"] = " ".join(f"{k}={st.get(k)}" for k in (
            "wasted_joins", "held_for_owner", "held_found_present", "held_again", "held_joined", "held_wasted",
            "held_late", "share_judged_down", "share_grace_ms", "share_leader_region"))
    figures["wasted_joins_fraction"] = round(figures["wasted_joins"] / figures["both_up_clicks"], 4)
    return figures


def _outage(root: Path, writer: Copies, joined: Joined, config, args) -> dict:
    """Phase 4: region b down whole for ``--outage-s`` while clicks keep coming, then back: its catch-up.
    The visible latency of the clicks written meanwhile: all of them, and b's share (as a saw the owners
    before: orphaned until a judges b down or sees the leader at home), over the first ``ORPHAN_WINDOW_S``
    of the outage and over all of it."""
    from photon.app import region_down, region_up
    from dispatcher import RegionShare
    old_pid = _status(config, "b").get("pid")
    before = len(writer.click_ids)
    share_a = _status(config, "a")
    following = Following(root, writer)
    t_down_us = time.time_ns() // 1000
    region_down(config, "b", hard=True)
    outage, _ = following.run(args.rate, args.outage_s, args.timeout)
    wait_until(lambda: joined.count() >= len(writer.click_ids), args.timeout, interval=0.2,
               message="region a joined everything alone")
    shared = RegionShare(list(PIPELINE), "a", 1, 1, 1, leader_fraction=config.dispatcher.share_leader_fraction)
    shared.follow_leader(share_a.get("share_leader_region") or None)     # owners as a saw them before
    b_share = [c for c in outage if shared.owner(c) == 1]
    early = [c for c in b_share if writer.written_us[c] - t_down_us <= ORPHAN_WINDOW_S * 1e6]
    def p(ids, q):
        return round(percentile(following.visible_ms(ids), q), 1) if ids else None
    figures = {"outage_join_p50_ms": p(outage, 50), "outage_join_p99_ms": p(outage, 99),
               "outage_b_share_p50_ms": p(b_share, 50), "outage_b_share_max_ms": p(b_share, 100),
               f"outage_b_share_first_{ORPHAN_WINDOW_S}s_p50_ms": p(early, 50),
               "outage_leader_region_before": share_a.get("share_leader_region", ""),
               "outage_a_judged_b_down": _status(config, "a").get("share_judged_down", 0)
               - share_a.get("share_judged_down", 0)}
    t_up = time.monotonic()
    region_up(config, "b")

    def b_caught_up() -> bool:
        s = _status(config, "b")
        return s.get("pid") not in (None, old_pid) and bool(s.get("caught_up"))
    wait_until(b_caught_up, args.timeout, interval=0.05, message="region b caught up")
    return {"catch_up_s": round(time.monotonic() - t_up, 2), "outage_clicks": len(writer.click_ids) - before,
            **figures}


def _one_rtt(root: Path, rtt_ms: float, args, net: RegionNetwork | None) -> dict:
    procs = []
    try:
        hosts = {n: net.host(n) for n in REGIONS} if net else None
        config_path = _write_config(root, hosts, 0.0 if net else rtt_ms, args.joiners, args.settings)
        config = load_config(config_path)
        writer = Copies([root / n for n in PIPELINE])
        joined = Joined(config)
        prefix = (lambda n: net.prefix(n)) if net else (lambda n: [])
        procs = [_start(config_path, n, prefix(n), root / f"launcher-{n}.log") for n in ("c", "a", "b")]
        figures: dict = {}
        t0 = time.monotonic()                            # 1. start-up
        writer.batch(1)
        wait_until(lambda: joined.count() >= 1, args.timeout, interval=0.05, message="the probe click joined")
        figures["startup_s"] = round(time.monotonic() - t0, 2)
        backlog = writer.format(args.backlog)            # 2. backlog
        t0 = time.monotonic()
        writer.write(backlog)
        wait_until(lambda: joined.count() >= args.backlog + 1, args.timeout, interval=0.05,
                   message=f"{args.backlog} backlog clicks joined")
        figures["backlog_clicks_joined_per_s"] = round(args.backlog / (time.monotonic() - t0), 1)
        figures.update(_steady(root, writer, config, args))
        figures.update(_outage(root, writer, joined, config, args))
        figures["outage_wasted_joins"] = _wasted_joins(config) - figures["wasted_joins"]
        figures["clicks"] = len(writer.click_ids)
        stop_groups(procs)
        procs = []
        figures["duplicates"] = joined.duplicates()
        return figures
    finally:
        stop_groups(procs)


def _targets(figures: dict, rtts: list[float]) -> None:
    """Whether the targets hold at the largest round trip against 0 ms: throughput judged on the unpaced
    backlog drain (the steady phase is paced: it carries the offered rate at any distance), latency on the
    steady phase's visible p50."""
    far = max(rtts)
    if 0.0 not in rtts or far == 0:
        return
    base_rate, far_rate = (figures.get("rtt0ms_backlog_clicks_joined_per_s"),
                           figures.get(f"rtt{far:g}ms_backlog_clicks_joined_per_s"))
    base_p50, far_p50 = figures.get("rtt0ms_join_p50_ms"), figures.get(f"rtt{far:g}ms_join_p50_ms")
    if base_rate and far_rate is not None:
        figures["throughput_ratio_far_vs_0ms"] = round(far_rate / base_rate, 3)
        figures["target_throughput_met"] = far_rate >= 0.8 * base_rate
    if base_p50 is not None and far_p50 is not None:
        figures["p50_excess_over_0ms_ms"] = round(far_p50 - base_p50, 1)
        figures["target_latency_met"] = far_p50 <= base_p50 + far + 50


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.regions", description=__doc__.splitlines()[0])
    p.add_argument("--rtts", default="0,30,100", help="round trips between regions in ms (comma-separated)")
    p.add_argument("--backlog", type=int, default=20_000, help="clicks written at once in the backlog phase")
    p.add_argument("--rate", type=int, default=1000, help="clicks per second offered in the steady and outage phases")
    p.add_argument("--seconds", type=float, default=45.0, help="length of the steady phase")
    p.add_argument("--outage-s", type=float, default=120.0, help="how long region b is down")
    p.add_argument("--joiners", type=int, default=2, help="joiners per region")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each wait may take")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra photon.toml option, e.g. dispatcher.max_in_flight=8 (repeatable)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.settings = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not (eq and dot and section and name and value):
            p.error(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. dispatcher.max_in_flight=8")
        args.settings.setdefault(section, {})[name] = value
    rtts = [float(x) for x in args.rtts.split(",") if x.strip()]
    refused = namespaces_refused()
    kind = delay_kind() if refused is None else None
    if kind is not None:
        distance = {"netem": "netns + tc netem", "relay": "netns + TUN relay (bench._wire)"}[kind]
    else:
        distance = f"loopback; simulated_rtt_ms between registry replicas only ({refused or 'no delay here'})"
    figures: dict = {"distance": distance, "asked_rate_clicks_per_s": args.rate, "steady_s": args.seconds,
                     "outage_s": args.outage_s, "settings": " ".join(args.set)}
    for rtt in rtts:
        with tempfile.TemporaryDirectory(prefix="bench-regions-") as tmp:
            net = RegionNetwork(list(REGIONS), rtt_ms=rtt, delay=kind).open() if kind else None
            try:
                r = _one_rtt(Path(tmp), rtt, args, net)
            finally:
                if net:
                    net.close()
        for k, v in r.items():
            figures[f"rtt{rtt:g}ms_{k}"] = v
    figures["duplicates"] = sum(v for k, v in figures.items() if k.endswith("_duplicates"))
    _targets(figures, rtts)
    emit(figures, args.json, "Photon regions benchmark: two regions (+ a registry-only one) at a distance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
