"""Single-region pipeline benchmark: ``python -m bench.pipeline [--clicks N] [--rate R] [--json]``.

Phase 1 (throughput): a backlog of ``--clicks`` clicks and ten queries per click is written, the pipeline
is started, and the time until every joinable click is in the output gives clicks joined per second;
queries per second is measured too: the time until the event store has indexed every backlog query (its
``events_indexed``, polled every 20 ms). Phase 2 (latency): the bench appends queries and their clicks at
``--rate`` clicks per second for ``--seconds`` and records, per click, the wall time right after its line
was completely written; a follower in the bench (outside the pipeline, :mod:`bench._output`) tails the
joined output every 2 ms and records when each joined line is first complete in an output file
(``join_p50_ms``...: written -> flushed joined line, as an outside reader sees it) and when it is first in
a published output file (``published_p50_ms``...). ``steady_rate_clicks_per_s`` is the rate achieved
(clicks written / real seconds of writing), ``asked_rate_clicks_per_s`` the rate asked.
``joined_at_stamp_p50_ms`` is the joiner's own stamp (``_photon.joined_at_us``, after the registry commit,
just before the write) minus the click's written time, for comparison.
Also printed: the registry's mean ids per replicated command and the peak RSS of each process.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psutil

from bench._common import emit, percentile, stop_groups
from bench._output import OutputFollower
from dispatcher import read_status
from photon import IdGenerator, load_config, read_output_lines, wait_until

ROOT = Path(__file__).resolve().parent.parent


def write_config(root: Path, joiners: int, settings: dict[str, dict[str, str]] | None = None) -> Path:
    """The bench's photon.toml; ``settings`` (section -> key -> TOML value) adds to or overrides it."""
    sections: dict[str, dict[str, str]] = {"join": {"unjoinable_after_s": "30"},
                                           "joiner": {"per_region": str(joiners)}}
    for section, values in (settings or {}).items():
        sections.setdefault(section, {}).update(values)
    tables = "".join(f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
                     for section, values in sections.items())
    cfg = root / "photon.toml"
    cfg.write_text(f"""{tables}[[regions]]
name = "a"
log_root = "logs"
output_root = "out"
state_dir = "state"
""")
    return cfg


class Writer:
    """Appends queries then clicks (10 queries per click) to files, as four writer processes would."""

    def __init__(self, root: Path, writers: int = 2) -> None:
        self.q = [open(self._path(root, "queries", w), "ab", buffering=0) for w in range(writers)]
        self.c = [open(self._path(root, "clicks", w), "ab", buffering=0) for w in range(writers)]
        self.seq = 0
        self.qgen = [IdGenerator("10.1.0.1", 100 + w) for w in range(writers)]
        self.cgen = [IdGenerator("10.2.0.1", 200 + w) for w in range(writers)]
        self.click_ids: list[str] = []
        self.written_us: dict[str, int] = {}   # click id -> wall time right after its line was written

    @staticmethod
    def _path(root: Path, stream: str, w: int) -> Path:
        d = root / "logs" / stream / f"w{w}"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{stream}-{int(time.time())}.jsonl"

    def format(self, clicks: int) -> tuple[list[bytes], list[bytes], list[list[str]]]:
        """Lines for ``clicks`` clicks and their ten queries each, per writer (queries, clicks, click ids)."""
        qlines = [[] for _ in self.q]
        clines = [[] for _ in self.c]
        cids = [[] for _ in self.c]
        for i in range(clicks):
            w = i % len(self.q)
            for _ in range(10):
                self.seq += 1
                qid = self.qgen[w].next_id()
                qlines[w].append(b'{"query_id":"%s","advertiser_id":"adv-%d","text":"q"}' % (qid.encode(), self.seq % 50))
            cid = self.cgen[w].next_id()
            self.click_ids.append(cid)
            cids[w].append(cid)
            clines[w].append(b'{"click_id":"%s","query_id":"%s","ad_id":"ad-1","written_at_us":WRITTEN}'
                             % (cid.encode(), qid.encode()))
        return ([b"\n".join(x) + b"\n" if x else b"" for x in qlines],
                [b"\n".join(x) + b"\n" if x else b"" for x in clines], cids)

    def write(self, formatted: tuple[list[bytes], list[bytes]]) -> None:
        """Append queries first, then clicks stamped with the time they are written."""
        qdata, cdata, cids = formatted
        for f, data in zip(self.q, qdata):
            f.write(data)
        stamp = str(time.time_ns() // 1000).encode()
        written = self.written_us
        for f, data, ids in zip(self.c, cdata, cids):
            f.write(data.replace(b"WRITTEN", stamp))   # unbuffered: complete in the file when this returns
            done = time.time_ns() // 1000
            for cid in ids:
                written[cid] = done

    def batch(self, clicks: int) -> None:
        self.write(self.format(clicks))


def joined_lines(out: Path) -> list[dict]:
    return [orjson.loads(line) for line in read_output_lines(out / "joined", include_inprogress=True)]


_published_counts: dict[Path, int] = {}


def count_joined(out: Path) -> int:
    """Joined lines so far; published files never change, so each is counted once (the bench must not
    steal the pipeline's CPU by re-reading its output)."""
    total = 0
    for p in (out / "joined").rglob("*.jsonl*"):
        if p.name.endswith(".jsonl"):
            if p not in _published_counts:
                _published_counts[p] = p.read_bytes().count(b"\n")
            total += _published_counts[p]
        else:
            try:
                total += p.read_bytes().count(b"\n")
            except FileNotFoundError:      # published meanwhile: counted on the next call
                return count_joined(out)
    return total


class RssSampler(threading.Thread):
    def __init__(self, state_file: Path) -> None:
        super().__init__(daemon=True)
        self.state_file, self.peak, self.stopped = state_file, {}, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                procs = json.loads(self.state_file.read_text())["processes"]
            except (OSError, ValueError, KeyError):
                continue
            for name, p in procs.items():
                try:
                    rss = psutil.Process(p["pid"]).memory_info().rss
                except (psutil.Error, TypeError):
                    continue
                self.peak[name] = max(self.peak.get(name, 0), rss)


class Follower(threading.Thread):
    """Polls an :class:`~bench._output.OutputFollower` every ``interval`` seconds until stopped."""

    def __init__(self, out: Path, interval: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.follower, self.interval, self.stopped = OutputFollower(out), interval, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.follower.poll()


class IndexedWatcher(threading.Thread):
    """Records when the region's event store has indexed ``target`` queries (its status, every 20 ms)."""

    def __init__(self, state_dir: Path, target: int) -> None:
        super().__init__(daemon=True)
        self.state_dir, self.target, self.done_at, self.stopped = state_dir, target, None, threading.Event()

    def run(self) -> None:
        from eventstore import EventStoreClient
        try:
            port = json.loads((self.state_dir / "ports.json").read_text())["eventstore"]
            port = port[0] if isinstance(port, list) else port
            client = EventStoreClient(f"127.0.0.1:{port}")
        except (OSError, ValueError, KeyError) as e:
            print(f"(queries/s unavailable: {e})", file=sys.stderr)
            return
        try:
            while not self.stopped.wait(0.02):
                try:
                    if client.status()["events_indexed"] >= self.target:
                        self.done_at = time.monotonic()
                        return
                except Exception:  # noqa: BLE001 - retried on the next poll
                    continue
        finally:
            client.close()


def registry_batch_size(config) -> float | None:
    try:
        import idregistry
        client = idregistry.connect(idregistry.registry_endpoints(config))
        try:
            stats = [s for s in client.status() if s.get("is_leader")]
        finally:
            client.close()
        total = {"ids": 0, "commands": 0}
        for s in stats:
            total["ids"] += s.get("ids_committed", 0)
            total["commands"] += s.get("commands", 0)
        if total["commands"]:
            return round(total["ids"] / total["commands"], 1)
    except Exception as e:  # noqa: BLE001 - a bench reports what it could not measure
        print(f"(registry batch size unavailable: {e})", file=sys.stderr)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clicks", type=int, default=50_000, help="backlog clicks in phase 1")
    ap.add_argument("--rate", type=int, default=1000, help="clicks per second in phase 2")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of phase 2")
    ap.add_argument("--joiners", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="extra photon.toml option, e.g. dispatcher.max_in_flight=8 (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="photon-bench-"))
    settings: dict[str, dict[str, str]] = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not (eq and dot and section and name and value):
            ap.error(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. dispatcher.max_in_flight=8")
        settings.setdefault(section, {})[name] = value
    cfg_path = write_config(root, args.joiners, settings)
    config = load_config(cfg_path)
    writer = Writer(root)
    backlog_lines = writer.format(args.clicks)          # formatted now, written once the pipeline is up
    launcher_log = open(root / "launcher.log", "ab")
    launcher = subprocess.Popen([sys.executable, "-m", "photon.app.cli", "run", "--config", str(cfg_path)], cwd=ROOT,
                                start_new_session=True, stdout=launcher_log, stderr=subprocess.STDOUT)
    sampler = RssSampler(root / "state" / "launcher.json")
    sampler.start()
    figures: dict = {}
    try:
        t0 = time.monotonic()
        writer.batch(1)                                  # a probe: the pipeline is up once it is joined
        wait_until(lambda: count_joined(root / "out") >= 1, timeout=120, interval=0.01, message="probe joined")
        figures["startup_s"] = round(time.monotonic() - t0, 2)
        indexed = IndexedWatcher(root / "state", 10 * (args.clicks + 1))
        indexed.start()
        t_start = time.monotonic()
        writer.write(backlog_lines)
        backlog = args.clicks
        def backlog_joined() -> bool:
            status = read_status(config.regions[0].state_dir) or {}
            if status.get("unjoinable"):
                raise SystemExit(f"{status['unjoinable']} backlog clicks became unjoinable: their queries fell out of "
                                 f"the event store's cache; lower --clicks or raise eventstore.cache_mb with --set")
            return count_joined(root / "out") >= backlog + 1
        wait_until(backlog_joined, timeout=600, interval=0.05, message=f"{backlog} backlog clicks joined")
        elapsed = time.monotonic() - t_start
        figures["clicks_per_s"] = round(backlog / elapsed, 1)
        indexed.join(timeout=60)
        indexed.stopped.set()
        if indexed.done_at is not None:
            figures["queries_per_s"] = round(10 * backlog / max(1e-6, indexed.done_at - t_start), 1)
        figures["backlog_clicks"] = backlog
        # phase 2: steady rate, latency from line written to joined line flushed
        start_seen = len(writer.click_ids)
        follower = Follower(root / "out" / "joined")
        follower.follower.poll()                         # the backlog's lines: read now, not timed
        follower.start()
        began = time.monotonic()
        end = began + args.seconds
        per_tick = max(1, args.rate // 50)
        next_t = time.monotonic()
        while time.monotonic() < end:
            writer.batch(per_tick)
            next_t += per_tick / args.rate
            time.sleep(max(0.0, next_t - time.monotonic()))   # pacing the load, not waiting for a condition
        writing_s = time.monotonic() - began
        steady_ids = writer.click_ids[start_seen:]
        f = follower.follower
        wait_until(lambda: all(c in f.published_us for c in steady_ids), timeout=300, interval=0.1,
                   message="phase-2 clicks joined and published")
        follower.stopped.set()
        follower.join(timeout=10)
        w = writer.written_us
        lat = [(f.seen_us[c] - w[c]) / 1000 for c in steady_ids]
        pub = [(f.published_us[c] - w[c]) / 1000 for c in steady_ids]
        steady = set(steady_ids)
        stamp = [(r["_photon"]["joined_at_us"] - w[r["click_id"]]) / 1000 for r in joined_lines(root / "out")
                 if r["click_id"] in steady]
        figures.update({"steady_clicks": len(lat), "steady_rate_clicks_per_s": round(len(steady_ids) / writing_s, 1),
                        "asked_rate_clicks_per_s": args.rate,
                        "join_p50_ms": round(percentile(lat, 50), 1), "join_p90_ms": round(percentile(lat, 90), 1),
                        "join_p99_ms": round(percentile(lat, 99), 1),
                        "published_p50_ms": round(percentile(pub, 50), 1),
                        "published_p90_ms": round(percentile(pub, 90), 1),
                        "joined_at_stamp_p50_ms": round(percentile(stamp, 50), 1)})
        ids = [r["click_id"] for r in joined_lines(root / "out")]
        figures["duplicates_in_output"] = len(ids) - len(set(ids))
        figures["registry_ids_per_command"] = registry_batch_size(config)
    finally:
        sampler.stopped.set()
        stop_groups([launcher])
        launcher_log.close()
    for name, rss in sorted(sampler.peak.items()):
        figures[f"peak_rss_mb_{name.replace('-', '_')}"] = round(rss / 2**20, 1)
    emit(figures, args.json, f"Photon single-region pipeline ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
