"""The registry client: routes ids to shards by the cached sharding config, sends commits to each shard's
leader (following redirects), reads from any replica, and retries through tenacity.

Thread-safe: one client may be shared by every thread of a process. Retrying a commit always reuses the
caller's token, so a commit whose reply was lost is answered ``OK`` on retry, never ``ALREADY_EXISTS``.
"""
from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from tenacity import Retrying, retry_if_exception_type, wait_exponential_jitter

from idregistry import registry_pb2 as pb
from idregistry import registry_pb2_grpc as pb_grpc
from photon import BadEventId
from idregistry._state import CommitResult, Sharding, check_ids, pack_ids, runs_of, runs_to_wire, split_checked
from photon.rpc import open_channel

_RESULTS = tuple(CommitResult)                       # by result code (the reply's bytes)
_WRONG_SHARD_CODE = int(CommitResult.WRONG_SHARD)
_WRONG_SHARD_BYTE = bytes([_WRONG_SHARD_CODE])

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.INTERNAL}
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20), ("grpc.max_send_message_length", 64 * 2**20),
                   ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.min_reconnect_backoff_ms", 50)]


class RegistryUnavailable(Exception):
    """No replica could answer within the client's retry budget."""


class _Retry(Exception):
    """One attempt failed in a way worth retrying (after a back-off); ``overloaded`` when a replica said
    so (RESOURCE_EXHAUSTED), rather than being unreachable, leaderless or catching up."""

    def __init__(self, message: str, overloaded: bool = False) -> None:
        super().__init__(message)
        self.overloaded = overloaded


UNAVAILABLE_MAX_WAIT_S = 0.25
"""Longest back-off while the registry is unreachable, leaderless or catching up (a starting registry
answers within a quarter of a second of electing its leader; a retry costs a replica little)."""
OVERLOADED_MAX_WAIT_S = 1.0
"""Longest back-off while a leader refuses for overload: the load must fall, so clients back off further."""
_WAIT_UNAVAILABLE = wait_exponential_jitter(multiplier=0.02, max=UNAVAILABLE_MAX_WAIT_S, jitter=0.05)
_WAIT_OVERLOADED = wait_exponential_jitter(multiplier=0.02, max=OVERLOADED_MAX_WAIT_S, jitter=0.05)


def retry_wait(retry_state) -> float:
    """tenacity's wait: exponential from 20 ms with jitter, capped by why the last attempt failed."""
    error = retry_state.outcome.exception() if retry_state.outcome is not None else None
    wait = _WAIT_OVERLOADED if getattr(error, "overloaded", False) else _WAIT_UNAVAILABLE
    return wait(retry_state)


@dataclass(frozen=True)
class ClientStatistics:
    commits: int
    ids_committed: int
    ids_too_old: int
    lookups: int
    retries: int
    redirects: int
    sharding_refreshes: int
    sharding_version: int


@dataclass(frozen=True)
class ShardStatistics:
    shard: int
    leader: str                       # gRPC address of the leader ("" when none is known)
    replicas_up: int
    term: int = 0
    commit_index: int = 0
    queue_depth: int = 0
    batch_ids_histogram: tuple = ()   # ((ids per command rounded up to a power of two, commands), ...)
    commands_per_s: float = 0.0
    ids_per_s: float = 0.0
    ids_held: int = 0
    bytes_held: int = 0
    gc_boundary_us: int = 0
    tokens_dropped_ids: int = 0        # ids whose token array was dropped after clear-tokens
    bytes_saved_by_clearing: int = 0   # bytes those token arrays held


@dataclass(frozen=True)
class RegistryStatistics:
    shards: tuple
    client: ClientStatistics


def read_order(replicas: list[str], turn: int, near_host: str | None = None) -> list[str]:
    """The order in which a lookup tries a shard's replicas (any replica may answer a lookup): round robin
    by ``turn`` among the replicas on ``near_host`` (the caller's own region, one wide-area round trip
    closer), then round robin among the others, which are tried only when every near one failed."""
    near = [r for r in replicas if near_host is not None and r.rpartition(":")[0] == near_host]
    far = [r for r in replicas if r not in near]
    out = []
    for group in (near, far):
        if group:
            k = turn % len(group)
            out += group[k:] + group[:k]
    return out


MIN_IDS_PER_RUN = 4
"""A commit goes packed (``IdRun``: prefix once, timestamps as int64) when its ids form runs of at least
this many on average; ids of ever-changing processes go as strings."""


def _commit_request(ids: list[str], token: str, runs: tuple | None = None) -> pb.CommitRequest:
    """The request committing ``ids`` under ``token``; ``runs``: their :func:`pack_ids` runs, if made already."""
    if runs is None:
        runs = pack_ids(ids)
    if len(runs) * MIN_IDS_PER_RUN > len(ids):
        return pb.CommitRequest(ids=ids, token=token)
    return pb.CommitRequest(token=token, runs=[pb.IdRun(prefix=p, timestamps_le=raw) for p, raw in runs_to_wire(runs)])


class RegistryClient:
    """``RegistryClient(["host:port", ...])``: any subset of replica addresses bootstraps it.

    ``lookup`` and ``commit`` return one result per id, in order. ``commit`` never returns WRONG_SHARD:
    it refreshes the sharding config and resends those ids. Raises :class:`RegistryUnavailable` when the
    shard cannot be reached within ``retry_timeout_s``; ``ValueError`` for malformed ids.
    """

    def __init__(self, endpoints: list[str], retry_timeout_s: float = 30.0, rpc_timeout_s: float = 15.0,
                 near_host: str | None = None) -> None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("RegistryClient needs at least one registry endpoint")
        self._bootstrap = list(endpoints)
        self._retry_timeout_s = retry_timeout_s
        self._rpc_timeout_s = rpc_timeout_s
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.RegistryStub]] = {}
        self._leaders: dict[int, str] = {}
        self._next_reader: dict[int, int] = defaultdict(int)
        self._near_host = near_host
        self._sharding: Sharding | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._counts = defaultdict(int)

    # ---- plumbing ----------------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.RegistryStub:
        with self._lock:
            if self._closed:
                raise RegistryUnavailable("registry client is closed")
            entry = self._channels.get(address)
            if entry is None:
                channel = open_channel(address, CHANNEL_OPTIONS)
                entry = self._channels[address] = (channel, pb_grpc.RegistryStub(channel))
            return entry[1]

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _with_retries(self, attempt):
        """``attempt()`` until it does not raise :class:`_Retry`, backing off between tries (:func:`retry_wait`),
        for up to ``retry_timeout_s`` from now; then :class:`RegistryUnavailable`.

        The first try is made before any retry machinery is built (a tenacity loop costs about 45 µs a call,
        and nearly every call is answered at once); when it fails, the loop takes that failure as its own
        first attempt, so the back-offs, the retry count and the budget (measured from the first try) are
        those of the loop alone."""
        began = time.monotonic()
        try:
            return attempt()
        except _Retry as e:
            first: _Retry | None = e
        budget = self._retry_timeout_s
        try:
            for tried in Retrying(stop=lambda _: time.monotonic() - began >= budget, reraise=True, wait=retry_wait,
                                  retry=retry_if_exception_type(_Retry),
                                  before_sleep=lambda _: self._count("retries")):
                with tried:
                    if first is not None:
                        failed, first = first, None
                        raise failed
                    return attempt()
        except _Retry as e:
            raise RegistryUnavailable(f"registry unavailable after {self._retry_timeout_s} s: {e}") from None

    def _rpc(self, address: str, method: str, request):
        try:
            return getattr(self._stub(address), method)(request, timeout=self._rpc_timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(e.details()) from None
            if e.code() in RETRYABLE:
                raise _Retry(f"{method} to {address}: {e.code().name} {e.details()}",
                             overloaded=e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED) from None
            raise

    # ---- the sharding config ------------------------------------------------------------------------

    def sharding(self, refresh: bool = False) -> Sharding:
        """The cached sharding config. Fetched from any replica on first use; ``refresh=True`` (done
        whenever a server says WRONG_SHARD) asks shard 0's leader, which answers after a read barrier."""
        if self._sharding is not None and not refresh:
            return self._sharding
        if self._sharding is None:
            got = self._with_retries(self._fetch_any)
        else:
            request = pb.ShardingRequest(authoritative=True)
            reply = self._with_retries(lambda: self._leader_call(0, "GetSharding", request))
            got = Sharding.from_dict(json.loads(reply.sharding_json))
        with self._lock:
            if self._sharding is None or got.version >= self._sharding.version:
                self._sharding = got
            self._counts["sharding_refreshes"] += 1
        return self._sharding

    def _fetch_any(self, newest: bool = False) -> Sharding:
        """The config from the first bootstrap replica that answers (``newest``: the newest any of
        them, or of shard 0's known replicas, has)."""
        errors, found = [], []
        known = list(self._sharding.endpoints.get(0, [])) if self._sharding else []
        for address in dict.fromkeys(self._bootstrap + known):
            try:
                reply = self._rpc(address, "GetSharding", pb.ShardingRequest())
            except _Retry as e:
                errors.append(str(e))
                continue
            found.append(Sharding.from_dict(json.loads(reply.sharding_json)))
            if not newest:
                break
        if not found:
            raise _Retry("; ".join(errors))
        return max(found, key=lambda s: s.version)

    @staticmethod
    def _check(ids: list[str]) -> None:
        try:
            check_ids(ids)
        except BadEventId as e:
            raise ValueError(str(e)) from None

    def _group(self, ids: list[str]) -> dict[int, list[int]]:
        sharding = self.sharding()
        if len(sharding.epochs) == 1 and sharding.epochs[0][1] == 1:    # one shard: no per-id work
            return {0: list(range(len(ids)))} if ids else {}
        groups: dict[int, list[int]] = defaultdict(list)
        for n, event_id in enumerate(ids):
            groups[sharding.shard_for(event_id)].append(n)
        return groups

    def _replicas(self, shard: int) -> list[str]:
        sharding = self.sharding()
        found = sharding.endpoints.get(shard)
        if not found:
            raise RegistryUnavailable(f"sharding config v{sharding.version} names no replicas for shard {shard}")
        return list(found)

    def _map_shards(self, fn, groups: dict[int, list[int]]):
        if len(groups) <= 1:
            return [fn(shard, idx) for shard, idx in groups.items()]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="registry-client")
        return list(self._pool.map(lambda item: fn(*item), groups.items()))

    # ---- reads -------------------------------------------------------------------------------------

    def lookup(self, ids: list[str]) -> list[bool]:
        """Whether each id is held; any replica may answer, so a just-committed id can read absent."""
        self._check(ids)
        out: list[bool] = [False] * len(ids)
        pending: list[int] | None = None          # positions in ids still to ask; None: all of them
        for _ in range(10):
            sub = list(ids) if pending is None else list(map(ids.__getitem__, pending))
            if not sub:
                break
            groups = self._group(sub)
            moved: list[int] = []

            def one(shard, idx, sub=sub, pending=pending):
                # (idx is increasing: as long as sub, it is all of sub in order)
                asked = sub if len(idx) == len(sub) else list(map(sub.__getitem__, idx))
                reply = self._with_retries(lambda: self._lookup_once(shard, asked))
                at = idx if pending is None else list(map(pending.__getitem__, idx))
                present = list(reply.present)           # (one C step, not an index into the reply per id)
                if not reply.wrong_shard and len(present) == len(at):
                    if len(at) == len(out):              # every id, in order (one shard, the first round)
                        out[:] = present
                    else:
                        deque(map(out.__setitem__, at, present), 0)
                    return
                wrong = set(reply.wrong_shard)
                for k, i in enumerate(at):
                    if k in wrong:
                        moved.append(i)
                    else:
                        out[i] = present[k]

            self._map_shards(one, groups)
            if moved:
                self.sharding(refresh=True)
            pending = sorted(moved)
        self._count("lookups")
        return out

    def _lookup_once(self, shard: int, ids: list[str]):
        replicas = self._replicas(shard)
        with self._lock:
            turn = self._next_reader[shard] = self._next_reader[shard] + 1
        errors = []
        for address in read_order(replicas, turn, self._near_host):
            try:
                return self._rpc(address, "Lookup", pb.LookupRequest(ids=ids))
            except _Retry as e:
                errors.append(str(e))
        raise _Retry("; ".join(errors))

    # ---- leader calls ------------------------------------------------------------------------------

    def _leader_call(self, shard: int, method: str, request):
        """Send to the shard's leader, following redirects; ``_Retry`` when none answered."""
        replicas = self._replicas(shard)
        guess = self._leaders.get(shard)
        order = ([guess] if guess else []) + [r for r in replicas if r != guess]
        errors = []
        overloaded = False
        tried = set()
        while order:
            address = order.pop(0)
            if address in tried:
                continue
            tried.add(address)
            try:
                reply = self._rpc(address, method, request)
            except _Retry as e:
                errors.append(str(e))
                overloaded = overloaded or e.overloaded
                continue
            if not reply.redirect:
                self._leaders[shard] = address
                return reply
            self._count("redirects")
            if reply.redirect != "?" and reply.redirect not in tried:
                order.insert(0, reply.redirect)
            errors.append(f"{address} is not the leader of shard {shard}")
        self._leaders.pop(shard, None)
        raise _Retry("; ".join(errors) or f"no replica of shard {shard} answered", overloaded=overloaded)

    def commit(self, ids: list[str], token: str) -> list[CommitResult]:
        """Insert each id iff absent under ``token``: OK (inserted now or earlier with this token),
        ALREADY_EXISTS (held under another token) or TOO_OLD (below the GC boundary: skip the event)."""
        try:
            whole_runs = runs_of(*split_checked(ids))     # checked and packed at once, for the usual request
        except BadEventId as e:
            raise ValueError(str(e)) from None
        out: list[CommitResult | None] = [None] * len(ids)
        pending = list(range(len(ids)))
        for _ in range(20):
            if not pending:
                break
            sub = ids if len(pending) == len(ids) else [ids[i] for i in pending]
            moved: list[int] = []

            def one(shard, idx, sub=sub):
                if len(idx) == len(ids):        # every id, in order: the runs made above
                    request = _commit_request(ids, token, whole_runs)
                else:
                    request = _commit_request(sub if len(idx) == len(sub) else [sub[i] for i in idx], token)
                reply = self._with_retries(lambda: self._leader_call(shard, "Commit", request))
                codes = reply.results
                if len(codes) != len(idx):     # e.g. a replica older than packed runs, which it cannot read
                    raise RegistryUnavailable(
                        f"registry shard {shard} answered {len(codes)} results for {len(idx)} ids; are its "
                        "replicas older than this client? (clients and replicas are upgraded together)")
                if _WRONG_SHARD_BYTE not in codes:       # the usual case: every id decided here
                    if len(idx) == len(out):            # every id, in order (one shard, first round)
                        out[:] = map(_RESULTS.__getitem__, codes)
                        return
                    for i, code in zip(idx, codes):
                        out[pending[i]] = _RESULTS[code]
                    return
                for k, i in enumerate(idx):
                    code = codes[k]
                    if code == _WRONG_SHARD_CODE:
                        moved.append(pending[i])
                    else:
                        out[pending[i]] = _RESULTS[code]

            self._map_shards(one, self._group(sub))
            if moved:
                self.sharding(refresh=True)
            pending = sorted(moved)
        if pending:
            raise RegistryUnavailable(f"{len(pending)} ids kept landing on the wrong shard")
        too_old = out.count(CommitResult.TOO_OLD)
        with self._lock:
            self._counts["commits"] += 1
            self._counts["ids_committed"] += len(ids) - too_old
            self._counts["ids_too_old"] += too_old
        return out

    def clear_tokens(self, ids: list[str]) -> int:
        """Drop the tokens of ids known to be in the output (the ids stay held); returns how many were
        cleared. A cleared id can no longer be deleted by recovery."""
        self._check(ids)
        cleared = 0
        pending = list(ids)
        for _ in range(20):
            if not pending:
                return cleared
            moved: list[str] = []
            counts: list[int] = []

            def one(shard, idx, sub=pending):
                request = pb.ClearTokensRequest(ids=[sub[i] for i in idx])
                reply = self._with_retries(lambda: self._leader_call(shard, "ClearTokens", request))
                counts.append(reply.cleared)
                moved.extend(request.ids[k] for k in reply.wrong_shard)

            self._map_shards(one, self._group(pending))
            cleared += sum(counts)
            if moved:
                self.sharding(refresh=True)
            pending = moved
        raise RegistryUnavailable(f"{len(pending)} ids kept landing on the wrong shard")

    def delete(self, event_id: str, expected_token: str) -> bool:
        """Remove ``event_id`` only if it is held with ``expected_token`` (recovery of a lost output);
        False when it is absent or held under another (or a cleared) token. Not idempotent: if a delete's
        reply is lost and the client retries, the retry answers False because the id is already gone;
        callers that must know can ``lookup`` the id afterwards."""
        self._check([event_id])
        request = pb.DeleteRequest(id=event_id, expected_token=expected_token)
        for _ in range(20):
            shard = self.sharding().shard_for(event_id)
            reply = self._with_retries(lambda: self._leader_call(shard, "Delete", request))
            if not reply.wrong_shard:
                return reply.deleted
            self.sharding(refresh=True)
        raise RegistryUnavailable(f"{event_id} kept landing on the wrong shard")

    def export(self, shard: int):
        """Iterate over ``(id, token, timestamp_us)`` of every id ``shard`` holds: :meth:`export_rows`
        without the registration time."""
        return (row[:3] for row in self.export_rows(shard))

    def export_rows(self, shard: int):
        """Iterate over ``(id, token, timestamp_us, registered_us)`` of every id ``shard`` holds (a cleared
        token is ``""``; ``registered_us`` is when its token was first committed, 0 when unknown), as of one position of the shard's log: the leader copies its entries between two
        commands after a replicated read barrier, so every id committed before the call is in it and ids
        committed later are not. Raises :class:`RegistryUnavailable` if the stream breaks off (the
        caller must then not use what it got as the shard's whole content)."""
        def find_leader() -> str:
            for address in self._replicas(shard):
                try:
                    reply = self._rpc(address, "Status", pb.StatusRequest())
                except _Retry:
                    continue
                leader = json.loads(reply.status_json).get("leader")
                if leader:
                    return leader
            raise _Retry(f"shard {shard} has no leader")

        def first_chunk():
            address = self._leaders.get(shard) or find_leader()
            stream = self._stub(address).Export(pb.ExportRequest(), timeout=3600)
            try:
                return stream, next(stream, None)
            except grpc.RpcError as e:
                self._leaders.pop(shard, None)
                raise _Retry(f"export of shard {shard} from {address}: {e.code().name}") from None

        stream, chunk = self._with_retries(first_chunk)
        try:
            while chunk is not None:
                registered = chunk.registered_us or [0] * len(chunk.ids)   # a replica that sends none: unknown
                yield from zip(chunk.ids, chunk.tokens, chunk.timestamps_us, registered)
                chunk = next(stream, None)
        except grpc.RpcError as e:
            raise RegistryUnavailable(f"export of shard {shard} broke off: {e.code().name} {e.details()}") from None

    def shards(self) -> list[int]:
        """Every shard number of the newest sharding config (all epochs)."""
        return list(range(self.sharding(refresh=True).max_shards()))

    def reshard(self, start_us: int, shards: int, endpoints: dict[int, list[str]]) -> Sharding:
        """Ask shard 0's leader to map ids from ``start_us`` on to ``shards`` shards. ``endpoints`` names
        the replicas of every shard of the new epoch. Raises ``ValueError`` with the reason if refused."""
        request = pb.ReshardRequest(start_us=start_us, shards=shards,
                                    endpoints_json=json.dumps({str(k): v for k, v in endpoints.items()}))
        reply = self._with_retries(lambda: self._leader_call(0, "Reshard", request))
        if reply.error:
            raise ValueError(f"reshard refused: {reply.error}")
        return self.sharding(refresh=True)

    # ---- seeing it ---------------------------------------------------------------------------------

    def status(self) -> list[dict]:
        """One dict per replica of every shard (``{"address", "error"}`` for one that did not answer).
        Works without a leader: the sharding config comes from whichever replicas answer."""
        if self._sharding is None:
            self.sharding()                   # bootstrap, with retries
        try:
            sharding = self._fetch_any(newest=True)
            with self._lock:
                if sharding.version > self._sharding.version:
                    self._sharding = sharding
        except _Retry:
            sharding = self._sharding
        out = []
        for shard in sorted(sharding.endpoints):
            for replica, address in enumerate(sharding.endpoints[shard]):
                try:
                    reply = self._stub(address).Status(pb.StatusRequest(), timeout=2.0)
                    out.append(json.loads(reply.status_json))
                except grpc.RpcError as e:
                    out.append({"shard": shard, "replica": replica, "address": address,
                                "error": f"{e.code().name}: {e.details()}"})
        return out

    def leaders(self, timeout: float = 2.0) -> dict[int, str]:
        """``{shard: gRPC address of its leader}`` as the first replica to answer in read order (the near
        ones first: no wide-area round trip) sees it; a shard whose leader no answering replica knows is
        left out."""
        out = {}
        sharding = self.sharding()
        for shard, replicas in sorted(sharding.endpoints.items()):
            for address in read_order(list(replicas), 0, self._near_host):
                status = self.replica_status(address, timeout)
                leader = status["address"] if status.get("is_leader") else status.get("leader")
                if leader:
                    out[shard] = leader
                    break
        return out

    def replica_status(self, address: str, timeout: float = 2.0) -> dict:
        """The status dict of the replica at ``address`` (which need not be in the sharding config yet)."""
        try:
            return json.loads(self._stub(address).Status(pb.StatusRequest(), timeout=timeout).status_json)
        except grpc.RpcError as e:
            return {"address": address, "error": f"{e.code().name}: {e.details()}"}

    def statistics(self) -> "RegistryStatistics":
        """Per shard, as its leader reports it (or the first replica that answered), plus this client's
        counters."""
        rows = self.status()
        shards = []
        for shard in sorted({r["shard"] for r in rows}):
            mine = [r for r in rows if r["shard"] == shard and "error" not in r]
            best = next((r for r in mine if r.get("is_leader")), mine[0] if mine else None)
            if best is None:
                shards.append(ShardStatistics(shard=shard, leader="", replicas_up=0))
                continue
            shards.append(ShardStatistics(
                shard=shard, leader=best["address"] if best.get("is_leader") else best.get("leader", ""),
                replicas_up=len(mine), term=best["term"], commit_index=best["commit_index"],
                queue_depth=best["queue_depth"],
                batch_ids_histogram=tuple((int(k), v) for k, v in best["batch_ids_histogram"].items()),
                commands_per_s=best["commands_per_s"], ids_per_s=best["ids_per_s"], ids_held=best["ids_held"],
                bytes_held=best["bytes_held"], gc_boundary_us=best["gc_boundary_us"],
                tokens_dropped_ids=best.get("tokens_dropped_ids", 0),
                bytes_saved_by_clearing=best.get("bytes_saved_by_clearing", 0)))
        return RegistryStatistics(shards=tuple(shards), client=self.client_statistics())

    def client_statistics(self) -> ClientStatistics:
        with self._lock:
            c = dict(self._counts)
        return ClientStatistics(commits=c.get("commits", 0), ids_committed=c.get("ids_committed", 0),
                                ids_too_old=c.get("ids_too_old", 0), lookups=c.get("lookups", 0),
                                retries=c.get("retries", 0), redirects=c.get("redirects", 0),
                                sharding_refreshes=c.get("sharding_refreshes", 0),
                                sharding_version=self._sharding.version if self._sharding else -1)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
            pool, self._pool = self._pool, None
        for channel, _ in channels:
            channel.close()
        if pool is not None:
            pool.shutdown(wait=False)

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
