"""``photon recover``: re-joins the clicks a verify run found registered but missing from the output.

Steps, each safe to repeat (a click is joined at most once whatever runs when, because every path into
the output goes through the registry's insert-if-absent commit):

1. Finish what an interrupted earlier run left (its intent file): re-inject those lines whose ids the
   registry no longer holds.
2. Take the recoverable events of a verify run (run here, or ``--from`` an earlier one's Parquet) and judge
   their joiners again now: an event is recovered if a lost-ids ledger records it under its token (that
   joiner gave it up), or its joiner is seen stopped, or its joiner cannot be seen from here and it was
   registered more than ``[verify].lost_after_s`` ago. Events of a joiner seen running are left alone.
3. Write the events to an intent file (fsynced), then delete each id from the registry **only if it is
   still held under the token verify saw** (the registry's conditional delete). A changed or cleared
   token, or an id already gone and joined, deletes nothing.
4. Write the raw lines, unchanged, as one new file into ``<log_root>/<foreign>-recovery/`` of every region
   (written under a dot-name, fsynced, renamed), which every region's dispatcher tails; then drop the
   intent file. Re-injecting is always safe: a dispatcher that finds the id registered drops it, and of
   several regions' attempts the registry accepts one.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

import idregistry
from photon import PhotonConfig, fsync_path, recovery_stream, storage_kind, write_atomic
from photon.app._liveness import STOPPED, UNSEEN, token_prefix, verdicts
from photon.app._verify import LEDGER_REASON, read_recoverable

INTENT_GLOB = "recover-intent-*.jsonl"
DELETE_THREADS = 8


@dataclass(frozen=True)
class RecoverReport:
    candidates: int              # recoverable events handed in
    joiner_alive: int            # left alone: their joiner runs (again), or is unseen and they are recent
    deleted: int                 # deleted from the registry under the token verify saw
    token_changed: int           # not deleted: held under another (or a cleared) token now
    reinjected: int              # lines written to the recovery stream (per region)
    resumed: int                 # lines re-injected from an interrupted earlier run
    files: tuple = ()
    dry_run: bool = False

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["files"] = list(self.files)
        return d


def _write_durably(path: Path, data: bytes) -> None:
    """A new file under a hidden temporary name, fsynced, renamed, its folder fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, durable=True)


def recovery_dir(config: PhotonConfig, region) -> Path:
    url = region.stream_url(recovery_stream(config.join.foreign_stream))
    return storage_kind(url).local_folder(url) or Path(url)


def reinject(config: PhotonConfig, raws: list[str], stamp: str) -> list[str]:
    """Write ``raws`` as one file into every region's recovery folder; returns the files."""
    if not raws:
        return []
    data = "".join(r.rstrip("\n") + "\n" for r in raws).encode()
    files = []
    name = f"recovered-{stamp}.jsonl"
    for region in config.pipeline_regions:
        recovery = region.stream_url(recovery_stream(config.join.foreign_stream))
        publisher = storage_kind(recovery).publisher(recovery, config.s3)
        if publisher is not None:       # objects written whole: staged, then one upload
            staging = config.verify_dir / "staging" / region.name / name
            _write_durably(staging, data)
            if not publisher.publish(staging, name):
                raise OSError(f"uploading recovered events to {recovery}/{name} failed; run recover again")
            files.append(f"{recovery}/{name}")
            continue
        path = recovery_dir(config, region) / name
        _write_durably(path, data)
        files.append(str(path))
    return files


def _resume(config: PhotonConfig, client, intent_dir: Path) -> tuple[int, list[str]]:
    """Re-inject the lines of interrupted runs whose ids the registry no longer holds."""
    resumed, files = 0, []
    for intent in sorted(intent_dir.glob(INTENT_GLOB)):
        rows = [orjson.loads(x) for x in intent.read_bytes().splitlines() if x.strip()]
        if rows:
            held = client.lookup([r["id"] for r in rows])
            raws = [r["raw"] for r, h in zip(rows, held) if not h]
            files += reinject(config, raws, intent.stem.removeprefix("recover-intent-") + "-resumed")
            resumed += len(raws)
        intent.unlink(missing_ok=True)
        fsync_path(intent_dir)
    return resumed, files


def _still_recoverable(config: PhotonConfig, rows: list[dict]) -> list[dict]:
    """The rows recovery may delete now (see step 2 of the module docstring), judged at this moment."""
    grace_us = int(config.verify.remote_joiner_grace_s * 1e6)
    now_us = time.time_ns() // 1000
    judged = verdicts({token_prefix(r["token"]) for r in rows}, [r.state_dir for r in config.regions], now_us,
                      grace_us)
    aged_before_us = now_us - int(config.verify.lost_after_s * 1e6)

    def recoverable(r: dict) -> bool:
        verdict = judged[token_prefix(r["token"])]
        return (r["reason"] == LEDGER_REASON or verdict == STOPPED
                or (verdict == UNSEEN and 0 < r["registered_us"] < aged_before_us))
    return [r for r in rows if recoverable(r)]


def run_recover(config: PhotonConfig, recoverable_path: str | Path, *, dry_run: bool = False,
                client=None) -> RecoverReport:
    """Recover the events of a verify run's ``recoverable`` Parquet (see the module docstring)."""
    rows = read_recoverable(recoverable_path)
    intent_dir = config.verify_dir
    own = client is None
    if own:
        client = idregistry.connect(idregistry.registry_endpoints(config))
    try:
        resumed, files = (0, []) if dry_run else _resume(config, client, intent_dir)
        todo = _still_recoverable(config, rows)
        if dry_run:
            return RecoverReport(len(rows), len(rows) - len(todo), 0, 0, 0, 0, (), True)
        stamp = f"{time.time_ns() // 1000}-{os.getpid()}"
        intent = intent_dir / f"recover-intent-{stamp}.jsonl"
        if todo:
            _write_durably(intent, b"".join(orjson.dumps({"id": r["id"], "raw": r["raw"]}) + b"\n" for r in todo))
        with ThreadPoolExecutor(DELETE_THREADS) as pool:
            deleted = list(pool.map(lambda r: client.delete(r["id"], r["token"]), todo))
        # a delete whose reply was lost answers False on retry: such an id is absent now, and re-injecting
        # an absent id is safe; one still held (another token) is left alone
        undecided = [r for r, d in zip(todo, deleted) if not d]
        held = client.lookup([r["id"] for r in undecided]) if undecided else []
        gone = {r["id"] for r, h in zip(undecided, held) if not h}
        raws = [r["raw"] for r, d in zip(todo, deleted) if d or r["id"] in gone]
        files += reinject(config, raws, stamp)
        if todo:
            intent.unlink(missing_ok=True)
            fsync_path(intent_dir)
        return RecoverReport(len(rows), len(rows) - len(todo), sum(deleted), len(undecided) - len(gone),
                             len(raws), resumed, tuple(files))
    finally:
        if own:
            client.close()
