"""``photon gen``: writes a workload in the DESIGN §3 log format, a ``photon.toml`` for it, and the truth.

Layout under ``out``::

    logs/<region>/queries/w<k>/queries-<seq>.jsonl    several writer processes per stream, rotated files
    logs/<region>/clicks/w<k>/clicks-<seq>.jsonl       every region gets a full copy of both streams
    photon.toml                                        a config joining them (one [[regions]] per region)
    truth/joinable.txt, truth/unjoinable.txt          click ids expected joined (once each) / never joined
    truth/summary.json                                 counts: queries, clicks, duplicates, bad lines

Query ids and click ids are real event ids whose timestamps increase per writer; a click's time is a
little after its query's. With ``id_style="uuid"`` ids are random UUIDs instead, each event carries its
time as RFC 3339 (``query_time``, ``click_time``, e.g. ``2025-11-21T08:00:00.123456Z``) and the config
names those fields (``[join].primary_time_field`` / ``foreign_time_field``). Unjoinable clicks name a query id that is never written; duplicated clicks
repeat a click line verbatim (possibly in another writer's file); bad lines are garbage of several kinds.
"""
from __future__ import annotations

import json
import random
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson

from photon._ids import format_event_id

BAD_LINE_KINDS = ("not json", "missing id", "bad id", "not an object")
ID_STYLES = ("photon", "uuid")
TIME_FIELDS = {"queries": "query_time", "clicks": "click_time"}   # with id_style="uuid"


@dataclass
class GenOptions:
    out: str
    queries: int = 200_000
    clicks_per_query: float = 0.1
    regions: tuple[str, ...] = ("a",)
    writers: int = 3
    rotate_lines: int = 20_000
    unjoinable_fraction: float = 0.02
    duplicate_fraction: float = 0.01
    bad_line_fraction: float = 0.001
    advertisers: int = 50
    start_us: int | None = None   # default: span_s before now, so ids are recent (not garbage collected)
    span_s: float = 600.0
    seed: int = 7
    unjoinable_after_s: float = 5.0
    id_style: str = "photon"      # one of ID_STYLES


@dataclass
class GenSummary:
    queries: int
    clicks_lines: int
    joinable_clicks: int
    unjoinable_clicks: int
    duplicate_click_lines: int
    bad_query_lines: int
    bad_click_lines: int
    regions: list
    config: str


def _bad_line(rng: random.Random, id_field: str) -> bytes:
    kind = rng.choice(BAD_LINE_KINDS)
    if kind == "not json":
        return b'{"' + id_field.encode() + b'": "10.0.0.1:1:00000000000' + b'", broken'
    if kind == "missing id":
        return orjson.dumps({"note": "no id here", "n": rng.randrange(1000)})
    if kind == "bad id":
        return orjson.dumps({id_field: f"not-an-id-{rng.randrange(10**6)}", "query_id": "also-bad"})
    return b'["an", "array"]'


class _StreamWriter:
    """Appends lines for one writer process of one stream, rotating files every ``rotate_lines``."""

    def __init__(self, root: Path, stream: str, writer: int, rotate_lines: int) -> None:
        self.dir = root / stream / f"w{writer}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stream, self.rotate_lines = stream, rotate_lines
        self.seq, self.count, self.buf = 0, 0, []

    def add(self, line: bytes) -> None:
        self.buf.append(line)
        self.count += 1
        if self.count % self.rotate_lines == 0:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            with open(self.dir / f"{self.stream}-{self.seq:05d}.jsonl", "ab") as f:
                f.write(b"\n".join(self.buf) + b"\n")
            self.buf = []
        if self.count and self.count % self.rotate_lines == 0:
            self.seq += 1


def rfc3339(time_us: int) -> str:
    """``2025-11-21T08:00:00.123456Z`` for a time in µs since the epoch (exact, no float)."""
    return (_EPOCH + timedelta(microseconds=time_us)).isoformat(timespec="microseconds").replace("+00:00", "Z")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class _Ids:
    """Makes the workload's ids and the fields that carry their time."""

    def __init__(self, style: str, rng: random.Random) -> None:
        if style not in ID_STYLES:
            raise ValueError(f"id_style must be one of {ID_STYLES}, got {style!r}")
        self.uuid, self.rng = style == "uuid", rng

    def make(self, ip: str, pid: int, time_us: int) -> str:
        if self.uuid:
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        return format_event_id(ip, pid, time_us)

    def fields(self, stream: str, time_us: int) -> dict:
        return {TIME_FIELDS[stream]: rfc3339(time_us)} if self.uuid else {}


def generate(opts: GenOptions) -> GenSummary:
    """Write the workload for ``opts``; returns its summary (also in ``truth/summary.json``)."""
    rng = random.Random(opts.seed)
    ids = _Ids(opts.id_style, random.Random(opts.seed + 1))
    out = Path(opts.out).resolve()
    logs = out / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    first = logs / opts.regions[0]
    q_writers = [_StreamWriter(first, "queries", w, opts.rotate_lines) for w in range(opts.writers)]
    c_writers = [_StreamWriter(first, "clicks", w, opts.rotate_lines) for w in range(opts.writers)]
    step = max(1, int(opts.span_s * 1e6 / max(1, opts.queries)))
    start_us = opts.start_us if opts.start_us is not None else time.time_ns() // 1000 - int(opts.span_s * 1e6)
    joinable: list[str] = []
    unjoinable: list[str] = []
    dup_lines = bad_q = bad_c = click_lines = 0
    click_seq = [0] * opts.writers
    for i in range(opts.queries):
        w = i % opts.writers
        t = start_us + i * step
        qid = ids.make(f"10.1.0.{w + 1}", 1000 + w, t)
        adv = f"adv-{rng.randrange(opts.advertisers)}"
        q_writers[w].add(orjson.dumps({"query_id": qid, **ids.fields("queries", t), "advertiser_id": adv,
                                       "country": rng.choice("ABCDE"), "text": f"query {i}"}))
        if rng.random() < opts.bad_line_fraction:
            q_writers[w].add(_bad_line(rng, "query_id"))
            bad_q += 1
        if rng.random() >= opts.clicks_per_query:
            continue
        cw = rng.randrange(opts.writers)
        click_seq[cw] += 1
        click_us = t + click_seq[cw]
        cid = ids.make(f"10.2.0.{cw + 1}", 2000 + cw, click_us)
        ref = qid
        if rng.random() < opts.unjoinable_fraction:
            ref = ids.make("10.9.9.9", 9, t)  # a query that is never logged
            unjoinable.append(cid)
        else:
            joinable.append(cid)
        line = orjson.dumps({"click_id": cid, **ids.fields("clicks", click_us), "query_id": ref,
                             "ad_id": f"ad-{rng.randrange(500)}",
                             "cost_micros": rng.randrange(10_000, 2_000_000)})
        c_writers[cw].add(line)
        click_lines += 1
        if rng.random() < opts.duplicate_fraction:
            c_writers[rng.randrange(opts.writers)].add(line)
            dup_lines += 1
            click_lines += 1
        if rng.random() < opts.bad_line_fraction:
            c_writers[cw].add(_bad_line(rng, "click_id"))
            bad_c += 1
    for wr in (*q_writers, *c_writers):
        wr.flush()
    for region in opts.regions[1:]:
        shutil.copytree(first, logs / region)
    truth = out / "truth"
    truth.mkdir(parents=True, exist_ok=True)
    (truth / "joinable.txt").write_text("".join(c + "\n" for c in joinable))
    (truth / "unjoinable.txt").write_text("".join(c + "\n" for c in unjoinable))
    config = out / "photon.toml"
    config.write_text(render_config(out, opts.regions, opts.unjoinable_after_s, opts.id_style))
    summary = GenSummary(opts.queries, click_lines, len(joinable), len(unjoinable), dup_lines, bad_q, bad_c,
                         list(opts.regions), str(config))
    (truth / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def render_config(out: Path, regions, unjoinable_after_s: float, id_style: str = "photon") -> str:
    uuid_ids = id_style == "uuid"
    parts = [
        "# Photon configuration written by `photon gen`. Paths are relative to this file.",
        "[join]",
        'primary_stream = "queries"',
        'foreign_stream = "clicks"',
        'primary_id_field = "query_id"',
        'foreign_id_field = "click_id"',
        'foreign_ref_field = "query_id"',
        'nest_primary_as = "query"',
        f"unjoinable_after_s = {unjoinable_after_s}",
        *([f'primary_time_field = "{TIME_FIELDS["queries"]}"', 'primary_time_format = "rfc3339"',
           f'foreign_time_field = "{TIME_FIELDS["clicks"]}"', 'foreign_time_format = "rfc3339"'] if uuid_ids else []),
        "",
        "[sql]",
        'foreign_schema = "click_id STRING, ' + ("click_time STRING, " if uuid_ids else "")
        + 'query_id STRING, ad_id STRING, cost_micros BIGINT"',
        'primary_schema = "query_id STRING, ' + ("query_time STRING, " if uuid_ids else "")
        + 'advertiser_id STRING, country STRING, text STRING"',
        "",
    ]
    for r in regions:
        parts += ["[[regions]]", f'name = "{r}"', f'log_root = "logs/{r}"', f'output_root = "out/{r}"',
                  f'state_dir = "state/{r}"', ""]
    return "\n".join(parts)
