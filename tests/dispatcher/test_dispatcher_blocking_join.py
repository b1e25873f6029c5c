"""The dispatcher sends each joiner request as a blocking call on a thread of its own (``JoinerClient.join``)
instead of a future. Held to the future (the form before) against a real gRPC joiner server scripted by the
request: random outcomes, a store behind with or without its positions, malformed answers (too few
outcomes), refusals (UNAVAILABLE) and answers slower than the call's deadline; the same outcomes, the same
store fields, the same failure and its message. Then a dispatcher fed by such a server through the real
``JoinerClient`` resolves every click as it is answered."""
from __future__ import annotations

import random
import time
from concurrent import futures

import grpc
import pytest

from joiner import JoinerClient, JoinerUnavailable
from joiner import joiner_pb2 as pb
from joiner import joiner_pb2_grpc as pb_grpc
from photon import free_port

pytestmark = pytest.mark.timeout(120)


class _Scripted(pb_grpc.JoinerServicer):
    """Answers by the request's first id: ``<seed>:...``; the seed picks what the answer is."""

    def Join(self, request, context):
        if not request.ids:
            return pb.JoinResponse(store_behind=True, store_read_to_us={"10.0.0.1:1": 5}, store_read_through_us=3)
        rng = random.Random(request.ids[0])
        kind = rng.randrange(8)
        n = len(request.ids)
        if kind == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"refused {n}")
        if kind == 1:
            time.sleep(0.5)                            # past the call's deadline (0.2 s)
        outcomes = [rng.randrange(6) for _ in range(n)]
        if kind == 2:
            outcomes = outcomes[:-1]                   # malformed: one outcome short
        resp = pb.JoinResponse(outcomes=outcomes)
        if kind == 3:
            resp.store_behind = True
        if kind == 4:
            resp.store_behind = True
            resp.store_read_to_us.update({f"10.0.0.{k}:1": rng.randrange(10**15) for k in range(3)})
            resp.store_read_through_us = rng.randrange(10**15)
        return resp


@pytest.fixture(scope="module")
def address():
    server = grpc.server(futures.ThreadPoolExecutor(8))
    pb_grpc.add_JoinerServicer_to_server(_Scripted(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def _answer(call):
    """What the dispatcher's inbox gets from a request: the outcomes with the store's fields, or the failure."""
    try:
        out = call()
    except JoinerUnavailable as e:
        return ("failed", str(e))
    return ("ok", list(out), out.store_behind, out.store_read_to_us, out.store_read_through_us)


def test_a_blocking_join_answers_as_the_future(address):
    rng = random.Random(14)
    with JoinerClient(address) as client:
        kinds = set()
        for k in range(80):
            n = rng.choice([0, 1, 3, 50, 1500]) if k else 0
            ids = [f"{k}-{rng.random()}:{i}" for i in range(n)]
            refs = [f"10.0.0.1:1:{i:016d}" for i in range(n)]
            raws = [b'{"click_id": "%d"}' % i for i in range(n)]
            blocking = _answer(lambda: client.join(ids, refs, raws, timeout=0.2))
            future = _answer(lambda: client.join_future(ids, refs, raws, timeout=0.2).result(timeout=10))
            assert blocking == future, (k, n)
            kinds.add(blocking[0] if blocking[0] == "failed" else (blocking[2], blocking[3] is not None))
        # every kind of answer was met: failures, plain answers, behind without and with positions
        assert kinds == {"failed", (False, False), (True, False), (True, True)}

