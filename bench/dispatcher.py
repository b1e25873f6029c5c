"""Dispatcher reading local files and S3: lines read and dispatched per second, S3 listing cost per poll,
and catch-up after a stop.

``python -m bench.dispatcher [--clicks N] [--objects K] [--json]`` starts its own ``moto_server`` on
127.0.0.1 (S3 figures are for moto on this machine, not for AWS) and runs a real dispatcher
(``dispatcher.serve``) over the same clicks twice, from local files and from S3, with instant in-process
joiners (so the figures are the dispatcher's own cost: listing, reading, parsing, batching, checkpoints).
Then:

* listing: ``K`` objects under one prefix; the cost of the first (full) listing and of an incremental
  poll (``StartAfter`` past the last key, plus a HEAD of the open object) in requests and milliseconds.
* catch-up: a backlog of 10 minutes of clicks (a simulated 10-minute stop) of which another region has
  joined 95%: the registry lookup answers them present, and only the rest goes to the joiners.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import mmh3

from bench._common import emit
from bench._moto import start_moto_server, stop_moto_server
from photon import Outcome, S3Config, open_source, parse_config, wait_until


class InstantJoiner:
    """Joins every click at once (the interface of ``joiner.JoinerClient``)."""

    def __init__(self, _address: str) -> None:
        self.sent = 0

    def join(self, ids, ref_ids, raws, timeout=None):
        self.sent += len(ids)
        return [Outcome.JOINED] * len(ids)

    def join_future(self, ids, ref_ids, raws, timeout=None):
        f: Future = Future()
        f.set_result(self.join(ids, ref_ids, raws, timeout))
        return f

    def close(self) -> None:
        pass


class OtherRegionJoined:
    """A registry in which another region already joined ``fraction`` of the clicks (by id hash)."""

    def __init__(self, fraction: float) -> None:
        self.limit = int(fraction * 1000)
        self.looked_up = 0

    def lookup(self, ids):
        self.looked_up += len(ids)
        return [mmh3.hash(i, signed=False) % 1000 < self.limit for i in ids]

    def close(self) -> None:
        pass


def write_clicks(root: Path, clicks: int, files: int, span_s: float) -> None:
    """``clicks`` lines over ``files`` files (two writer folders), ids spread over the last ``span_s``."""
    start_us = time.time_ns() // 1000 - int(span_s * 1e6)
    per_file = max(1, clicks // files)
    step = max(1, int(span_s * 1e6 / max(1, clicks)))
    n = 0
    for f in range(files):
        d = root / "clicks" / f"w{f % 2}"
        d.mkdir(parents=True, exist_ok=True)
        lines = []
        for _ in range(per_file if f < files - 1 else clicks - n):
            ts = start_us + n * step
            cid = f"10.9.0.1:77:{ts:016d}"
            qid = f"10.8.0.1:66:{ts - 1000:016d}"
            lines.append(b'{"click_id":"%s","query_id":"%s","ad":"a%d"}\n' % (cid.encode(), qid.encode(), n % 50))
            n += 1
        (d / f"clicks-{f:05d}.jsonl").write_bytes(b"".join(lines))


def upload(client, bucket: str, root: Path, prefix: str) -> None:
    paths = [p for p in sorted(root.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(root).as_posix()}",
                                                  Body=p.read_bytes()), paths))


def run_dispatcher(log_root: str, work: Path, clicks: int, registry=None) -> tuple[float, InstantJoiner]:
    """Seconds for a fresh dispatcher to read and resolve ``clicks`` clicks from ``log_root``."""
    import dispatcher
    state = work / f"state-{time.monotonic_ns()}"
    config = parse_config({"regions": [{"name": "a", "log_root": log_root, "output_root": str(work / "out"),
                                        "state_dir": str(state)}],
                           "s3": {"list_interval_s": 0.05}, "dispatcher": {"batch_size": 1000}})
    joiners: list[InstantJoiner] = []

    def factory(address):
        joiners.append(InstantJoiner(address))
        return joiners[-1]
    t0 = time.perf_counter()
    d = dispatcher.serve(config, "a", ["bench:1"], joiner_client=factory, registry_client=registry)
    try:
        def done():
            st = d.core.statistics()
            return st.events_read >= clicks and not (st.queued or st.in_flight or st.retry_queue)
        wait_until(done, 600, interval=0.005, message=f"{clicks} clicks resolved")
        elapsed = time.perf_counter() - t0
    finally:
        d.stop()
        if d.error is not None:
            raise d.error
    return elapsed, joiners[0]


def listing_cost(client, bucket: str, objects: int) -> dict:
    body = b'{"click_id":"x","query_id":"y"}\n'
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=f"many/w0/c-{k:06d}.jsonl", Body=body),
                      range(objects)))
    source = open_source(f"s3://{bucket}/many", S3Config(list_interval_s=0.0, full_list_interval_s=3600.0),
                         client=client)
    t0 = time.perf_counter()
    view = source.scan()
    full_ms = (time.perf_counter() - t0) * 1000
    full_requests = source.statistics().last_scan_requests
    consumed = {name: info.size for name, info in view.items()}
    polls = 20
    t0 = time.perf_counter()
    for _ in range(polls):
        source.scan(consumed)
    poll_ms = (time.perf_counter() - t0) * 1000 / polls
    return {"listing_objects": len(view), "full_list_ms": round(full_ms, 1), "full_list_requests": full_requests,
            "incremental_poll_ms": round(poll_ms, 2),
            "incremental_poll_requests": source.statistics().last_scan_requests}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dispatcher", description=__doc__.split("\n")[0])
    ap.add_argument("--clicks", type=int, default=200_000, help="clicks per run")
    ap.add_argument("--files", type=int, default=40, help="objects the clicks are spread over")
    ap.add_argument("--objects", type=int, default=10_000, help="objects for the listing-cost figure")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    work = Path(tempfile.mkdtemp(prefix="photon-bench-dispatcher-"))
    moto = start_moto_server()
    endpoint = moto.endpoint
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    try:
        import boto3
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        write_clicks(work / "logs", args.clicks, args.files, span_s=600.0)
        upload(client, "bench", work / "logs", "logs")
        local_s, _ = run_dispatcher(str(work / "logs"), work, args.clicks)
        s3_s, _ = run_dispatcher("s3://bench/logs", work, args.clicks)
        registry = OtherRegionJoined(0.95)
        catch_s, joiner = run_dispatcher("s3://bench/logs", work, args.clicks, registry=registry)
        figures = {
            "clicks": args.clicks,
            "local_lines_per_s": round(args.clicks / local_s),
            "s3_lines_per_s": round(args.clicks / s3_s),
            **listing_cost(client, "bench", args.objects),
            "catchup_clicks_per_s": round(args.clicks / catch_s),
            "catchup_s_per_10_min_stop": round(catch_s, 2),
            "catchup_sent_to_joiners_fraction": round(joiner.sent / args.clicks, 3),
            "catchup_looked_up": registry.looked_up,
        }
    finally:
        stop_moto_server(moto)
        shutil.rmtree(work, ignore_errors=True)
    emit(figures, args.json, "Dispatcher over local files and S3 (moto on 127.0.0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
