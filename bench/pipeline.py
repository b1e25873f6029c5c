"""Single-region pipeline benchmark: ``python -m bench.pipeline [--clicks N] [--rate R] [--json]``.

Phase 1 (throughput): a backlog of ``--clicks`` clicks and ten queries per click is written, the pipeline
is started, and the time until every joinable click is in the output gives clicks joined per second and
queries read per second. Phase 2 (latency): a writer appends queries and their clicks at ``--rate`` clicks
per second for ``--seconds``; each click line carries the wall time it was written, and the latency is
``_photon.joined_at_us`` (stamped by the joiner just before it flushes the line) minus that time.
Also printed: the registry's mean ids per replicated command and the peak RSS of each process.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psutil

from bench._common import emit, percentile
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

    @staticmethod
    def _path(root: Path, stream: str, w: int) -> Path:
        d = root / "logs" / stream / f"w{w}"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{stream}-{int(time.time())}.jsonl"

    def format(self, clicks: int) -> tuple[list[bytes], list[bytes]]:
        """Lines for ``clicks`` clicks and their ten queries each, per writer (queries, clicks)."""
        qlines = [[] for _ in self.q]
        clines = [[] for _ in self.c]
        for i in range(clicks):
            w = i % len(self.q)
            for _ in range(10):
                self.seq += 1
                qid = self.qgen[w].next_id()
                qlines[w].append(b'{"query_id":"%s","advertiser_id":"adv-%d","text":"q"}' % (qid.encode(), self.seq % 50))
            cid = self.cgen[w].next_id()
            self.click_ids.append(cid)
            clines[w].append(b'{"click_id":"%s","query_id":"%s","ad_id":"ad-1","written_at_us":WRITTEN}'
                             % (cid.encode(), qid.encode()))
        return ([b"\n".join(x) + b"\n" if x else b"" for x in qlines],
                [b"\n".join(x) + b"\n" if x else b"" for x in clines])

    def write(self, formatted: tuple[list[bytes], list[bytes]]) -> None:
        """Append queries first, then clicks stamped with the time they are written."""
        qdata, cdata = formatted
        for f, data in zip(self.q, qdata):
            f.write(data)
        stamp = str(time.time_ns() // 1000).encode()
        for f, data in zip(self.c, cdata):
            f.write(data.replace(b"WRITTEN", stamp))

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
        figures["queries_per_s"] = round(10 * backlog / elapsed, 1)
        figures["backlog_clicks"] = backlog
        # phase 2: steady rate, latency from line written to joined line flushed
        start_seen = len(writer.click_ids)
        end = time.monotonic() + args.seconds
        per_tick = max(1, args.rate // 50)
        next_t = time.monotonic()
        while time.monotonic() < end:
            writer.batch(per_tick)
            next_t += per_tick / args.rate
            time.sleep(max(0.0, next_t - time.monotonic()))
        total = len(writer.click_ids)
        wait_until(lambda: count_joined(root / "out") >= total, timeout=300, interval=0.1,
                   message="phase-2 clicks joined")
        steady = set(writer.click_ids[start_seen:])
        lat = [(r["_photon"]["joined_at_us"] - r["written_at_us"]) / 1000 for r in joined_lines(root / "out")
               if r["click_id"] in steady]
        figures.update({"steady_clicks": len(lat), "steady_rate_clicks_per_s": args.rate,
                        "join_p50_ms": round(percentile(lat, 50), 1), "join_p90_ms": round(percentile(lat, 90), 1),
                        "join_p99_ms": round(percentile(lat, 99), 1)})
        ids = [r["click_id"] for r in joined_lines(root / "out")]
        figures["duplicates_in_output"] = len(ids) - len(set(ids))
        figures["registry_ids_per_command"] = registry_batch_size(config)
    finally:
        sampler.stopped.set()
        os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        launcher_log.close()
    for name, rss in sorted(sampler.peak.items()):
        figures[f"peak_rss_mb_{name.replace('-', '_')}"] = round(rss / 2**20, 1)
    emit(figures, args.json, f"Photon single-region pipeline ({root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
