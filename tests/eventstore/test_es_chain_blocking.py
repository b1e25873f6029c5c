"""The chain's last (usually only) lookup of a request is a blocking call on the request's thread; every
other store is asked through a future as before. Held to the all-futures form on random requests over real
gRPC servers: the same raws, who served each, read positions and failures."""
from __future__ import annotations

import random
from concurrent import futures

import grpc
import pytest

import eventstore._chain as chain_module
from eventstore import EventStoreChain, EventStoreUnavailable, eventstore_pb2_grpc
from eventstore._servicer import EventStoreServicer
from photon import format_event_id


class _Store:
    """A store holding ``held`` (id -> raw line), reporting fixed read positions."""

    def __init__(self, held: dict[str, bytes], read_through_us: int | None, read_to_us: dict | None) -> None:
        self.held, self.read_through_us, self.read_to_us = held, read_through_us, read_to_us
        self.failing = False

    def lookup(self, ids):
        if self.failing:
            raise RuntimeError("store down")
        return [self.held.get(i) for i in ids]


def _all_futures(asks):
    """The form before: every store asked through a future, waited in order."""
    return [(client, client.lookup_future(ids)) for client, ids in asks]


def _serve(store):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    eventstore_pb2_grpc.add_EventStoreServicer_to_server(EventStoreServicer(store), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def _answer(chain, ids):
    try:
        raws = chain.lookup(ids)
    except EventStoreUnavailable as e:
        return ("unavailable", str(e).split(":")[0])
    return raws, chain.served_by, chain.read_through_us, chain.read_to_us


@pytest.mark.parametrize("caches,logs", [(1, 0), (1, 1), (3, 1), (2, 2)])
def test_a_chain_with_its_last_lookup_blocking_answers_as_all_futures(caches, logs, monkeypatch):
    rng = random.Random(caches * 10 + logs)
    universe = [format_event_id(f"10.0.0.{rng.randrange(1, 4)}", rng.randrange(1, 5),
                                1_763_712_000_000_000 + rng.randrange(10**9)) for _ in range(400)]
    stores, servers, addresses = [], [], []
    for n in range(caches + logs):
        held = {i: f'{{"query_id":"{i}","by":{n}}}'.encode() for i in universe if rng.random() < 0.4}
        catching_up = n < caches and rng.random() < 0.5
        store = _Store(held, rng.choice([None, 1_000 + n, 5_000 - n]),
                       {"10.0.0.1:1": 700 + n} if catching_up else None)
        server, address = _serve(store)
        stores.append(store)
        servers.append(server)
        addresses.append(address)
    chain = EventStoreChain(addresses[:caches], addresses[caches:])
    found = 0
    try:
        for round_ in range(60):
            ids = rng.sample(universe, rng.randrange(0, 60))
            down = rng.randrange(len(stores)) if round_ % 7 == 6 else None
            if down is not None:
                stores[down].failing = True
            fast = _answer(chain, ids)
            with monkeypatch.context() as m:
                m.setattr(chain_module, "_started", _all_futures)
                before = _answer(chain, ids)
            if down is not None:
                stores[down].failing = False
            assert fast == before
            if down is None and ids:
                found += sum(r is not None for r in fast[0])
        assert found > 0                                  # the requests did find lines
    finally:
        chain.close()
        for server in servers:
            server.stop(0)

