"""A real event store and a real joiner gRPC server with the registry's in-process twin or a fake of it."""
from __future__ import annotations

import os
import threading

import orjson
import pytest

import joiner
from joiner import JoinerClient, JoinerUnavailable, Outcome
from photon import ConfigError, free_port, read_output_lines, wait_until

from fake_registry import FakeRegistry, FakeRegistryDown
from joiner_helpers import (BASE_US, click_id, click_line, clicks, fresh_click_pid, inprogress_files, joined_lines,
                            join_held_in_commit, make_config, published_files, query_line, write_queries)

J, AJ, NF, T, U, L = Outcome


def test_join_not_found_then_found_and_never_twice(stack):
    import idregistry
    s = stack(idregistry.connect("memory://"))
    pid = fresh_click_pid()
    write_queries(s.root, range(10))
    s.wait_queries(10)
    ids, refs, raws = clicks(range(15), pid=pid)
    answer = s.client.join(ids, refs, raws)
    assert answer == [J] * 10 + [NF] * 5 and not answer.store_behind
    # a retry of the same events is a new attempt with a new token: the registry says already joined
    assert s.client.join(ids, refs, raws) == [AJ] * 10 + [NF] * 5
    write_queries(s.root, range(10, 15), name="q-later.log")
    s.wait_queries(15)
    assert s.client.join(ids[10:], refs[10:], raws[10:]) == [J] * 5
    wait_until(lambda: not inprogress_files(s.joined_dir) and len(joined_lines(s.joined_dir)) == 15,
               10, message="all 15 joined lines published")
    out = joined_lines(s.joined_dir)
    assert sorted(e["click_id"] for e in out) == sorted(ids)
    for e in out:
        n = int(e["click_id"][-6:])  # click n is at BASE_US + 1s + n
        assert {k: v for k, v in e.items() if k not in ("query", "_photon")} == orjson.loads(click_line(n, pid=pid))
        assert e["query"] == orjson.loads(query_line(n))
        assert e["_photon"]["region"] == "a" and e["_photon"]["joiner"] == "a-j0"
        assert e["_photon"]["joined_at_us"] > BASE_US
    st = s.client.status()
    assert (st["requests"], st["events"], st["joined"], st["already_registered"], st["not_found"]) == (3, 35, 15, 10, 10)
    assert st["lines_written"] == 15 and st["in_flight"] == 0 and st["name"] == "a-j0"
    assert st["output_commits"] >= 2          # the two requests that wrote lines each waited for a commit
    wait_until(lambda: joiner.read_status(s.root / "state").get("a-j0", {}).get("joined") == 15, 10,
               message="status file with 15 joined")


def test_a_store_catching_up_makes_not_found_throttled(stack):
    """The event store reports with every lookup up to when it has read its logs. A store behind by more
    than [joiner].store_behind_s (here any lag at all) may still read a missing query: not NOT_FOUND."""
    import idregistry
    s = stack(idregistry.connect("memory://"), store_behind_s=1e-6)
    write_queries(s.root, range(3))
    s.wait_queries(3)
    ids, refs, raws = clicks(range(5), pid=fresh_click_pid())
    answer = s.client.join(ids, refs, raws)
    assert answer == [J] * 3 + [T] * 2 and answer.store_behind       # the dispatcher waits for the store
    st = s.client.status()
    assert (st["not_found"], st["throttled"], st["not_found_store_behind"]) == (0, 2, 2)


class _StoreReadingItsLogs:
    """An event store still reading its logs (read_through_us 0) that holds queries 0-2 and says how far it
    has read each writer of queries, as a catching-up cache server does."""

    def __init__(self) -> None:
        import eventstore
        from joiner_helpers import query_id
        from photon import id_timestamp_us
        self.key = query_id(0).rsplit(":", 1)[0]
        self.inner = eventstore.InMemoryEventStore()
        self.inner.put_many([(query_id(n), query_line(n)) for n in range(3)])
        self.read_through_us = 0
        self.read_to_us = {self.key: id_timestamp_us(query_id(2))}
        self.asked: list[list[str]] = []

    def lookup(self, ids):
        self.asked.append(list(ids))
        return self.inner.lookup(ids)


def test_a_store_catching_up_says_how_far_it_has_read_and_an_empty_request_asks_for_that_alone(stack):
    """The dispatcher holds back clicks whose query the store cannot have read yet: every answer while the store
    is behind carries its position, and a request with no events (the dispatcher's probe) is answered with it
    alone. Once the store has caught up, answers carry no position."""
    import idregistry
    store = _StoreReadingItsLogs()
    s = stack(idregistry.connect("memory://"), eventstore_address=store)
    ids, refs, raws = clicks(range(5), pid=fresh_click_pid())
    answer = s.client.join(ids, refs, raws)
    assert answer == [J] * 3 + [T] * 2 and answer.store_behind
    assert answer.store_read_to_us == store.read_to_us and answer.store_read_through_us == 0
    probe = s.client.join([], [], [])
    assert probe == [] and probe.store_behind and probe.store_read_to_us == store.read_to_us
    assert store.asked[-1] == []                        # the probe asked the store for its position
    store.read_through_us, store.read_to_us = 2**62, None  # caught up
    probe = s.client.join([], [], [])
    assert probe == [] and not probe.store_behind and probe.store_read_to_us is None
    assert s.client.join(ids[3:], refs[3:], raws[3:]) == [NF, NF]
    assert s.client.status()["not_found_store_behind"] == 2


def test_click_logged_twice_in_one_request_is_joined_once(stack):
    reg = FakeRegistry()
    s = stack(reg)
    write_queries(s.root, [1, 2])
    s.wait_queries(2)
    ids, refs, raws = clicks([1, 2, 1])
    assert s.client.join(ids, refs, raws) == [J, J, AJ]
    assert reg.commits[0][0] == [click_id(1), click_id(2)]
    s.server.stop()
    assert sorted(e["click_id"] for e in joined_lines(s.joined_dir)) == [click_id(1), click_id(2)]


def test_tokens_name_the_joiner_and_differ_per_request(stack):
    reg = FakeRegistry()
    s = stack(reg)
    write_queries(s.root, range(3))
    s.wait_queries(3)
    for n in range(3):
        assert s.client.join(*clicks([n])) == [J]
    tokens = [t for _, t in reg.commits]
    assert len(set(tokens)) == 3
    prefixes = {t.rsplit("/", 1)[0] for t in tokens}
    assert len(prefixes) == 1
    address, pid, start_us = prefixes.pop().split("/")
    assert address == s.server.address and int(pid) == os.getpid() and int(start_us) > BASE_US
    seqs = [int(t.rsplit("/", 1)[1]) for t in tokens]
    assert seqs == sorted(seqs)


def test_over_max_in_flight_is_throttled_at_once(stack):
    reg = FakeRegistry()
    reg.gate = threading.Event()
    s = stack(reg, max_in_flight=1)
    write_queries(s.root, range(4))
    s.wait_queries(4)
    first = s.client.join_future(*clicks([0, 1]))
    wait_until(lambda: reg.waiting == 1, 10, message="first request inside the registry commit")
    assert s.client.join(*clicks([2, 3])) == [T, T]
    assert s.client.status()["requests_throttled"] == 1
    reg.gate.set()
    assert first.result(timeout=10) == [J, J]
    assert s.client.join(*clicks([2, 3])) == [J, J]


def test_registry_failure_is_throttled_and_writes_nothing(stack):
    reg = FakeRegistry()
    reg.fail_with = FakeRegistryDown("no leader")
    s = stack(reg, commit_patience_s=0)
    write_queries(s.root, range(3))
    s.wait_queries(3)
    ids, refs, raws = clicks(range(4))
    assert s.client.join(ids, refs, raws) == [T, T, T, NF]
    assert s.client.status()["registry_errors"] == 1
    s.server.joiner._writer.roll()
    assert not list(s.joined_dir.glob("*"))
    reg.fail_with = None
    assert s.client.join(ids, refs, raws) == [J, J, J, NF]


class FlakyRegistry(FakeRegistry):
    """Commits (really: the ids are registered) but fails to answer the first ``lost_replies`` times, as
    when a leader dies after replicating a command."""

    def __init__(self, lost_replies: int) -> None:
        super().__init__()
        self.lost_replies = lost_replies

    def commit(self, ids, token):
        results = super().commit(ids, token)
        if self.lost_replies:
            self.lost_replies -= 1
            raise FakeRegistryDown("reply lost")
        return results


def test_a_commit_whose_reply_is_lost_is_retried_with_its_token_and_written(stack):
    reg = FlakyRegistry(lost_replies=2)
    s = stack(reg)
    write_queries(s.root, range(2))
    s.wait_queries(2)
    ids, refs, raws = clicks(range(2))
    assert s.client.join(ids, refs, raws) == [J, J]
    assert [t for _, t in reg.commits] == [reg.commits[0][1]] * 3      # one token, three tries
    assert s.client.status()["commit_retries"] == 2
    s.server.joiner._writer.roll()
    assert sorted(orjson.loads(x)["click_id"] for x in read_output_lines(s.joined_dir)) == sorted(ids)
    # the dispatcher's own retry of the same clicks (new request, new token) is refused: no duplicate
    assert s.client.join(ids, refs, raws) == [AJ, AJ]


def test_event_store_down_is_throttled_and_commits_nothing(stack):
    reg = FakeRegistry()
    s = stack(reg, eventstore_address=f"127.0.0.1:{free_port()}")
    assert s.client.join(*clicks(range(3))) == [T, T, T]
    assert reg.commits == [] and s.client.status()["eventstore_errors"] == 1


def test_too_old_is_unjoinable(stack):
    reg = FakeRegistry(gc_boundary_us=BASE_US + 1_000_000 + 2)
    s = stack(reg)
    write_queries(s.root, range(4))
    s.wait_queries(4)
    assert s.client.join(*clicks(range(4))) == [U, U, J, J]


def test_user_adapter_refusing_and_failing_only_affects_its_events(stack):
    s = stack(FakeRegistry(), adapter="sample_adapters:flat")
    write_queries(s.root, range(3))
    s.wait_queries(3)
    ids, refs, _ = clicks(range(3))
    raws = [click_line(0), click_line(1, fraud=True), click_line(2, explode=True)]
    assert s.client.join(ids, refs, raws) == [J, U, U]
    st = s.client.status()
    assert st["adapter_errors"] == 1 and st["unjoinable"] == 2
    s.server.stop()
    [event] = joined_lines(s.joined_dir)
    assert event["query_text"] == "shoes 000000" and event["_photon"]["joiner"] == "a-j0" and "query" not in event


def test_output_rolls_by_time_and_size_and_files_are_whole(stack):
    s = stack(FakeRegistry(), roll_mb=0.002, roll_interval_s=0.2)
    write_queries(s.root, range(40))
    s.wait_queries(40)
    for k in range(4):
        assert s.client.join(*clicks(range(k * 10, k * 10 + 10))) == [J] * 10
    wait_until(lambda: not inprogress_files(s.joined_dir), 10, message="output rolled by time")
    files = published_files(s.joined_dir)
    assert len(files) >= 3 and all(f.name.startswith("a-j0-") and f.name.endswith(".jsonl") for f in files)
    assert all(f.read_bytes().endswith(b"\n") for f in files)
    assert sorted(e["click_id"] for e in joined_lines(s.joined_dir)) == sorted(click_id(n) for n in range(40))
    assert s.client.status()["files_rolled"] == len(files)


def test_ragged_request_is_refused(stack):
    s = stack(FakeRegistry())
    ids, refs, raws = clicks(range(2))
    with pytest.raises(JoinerUnavailable, match="INVALID_ARGUMENT"):
        s.client.join(ids, refs[:1], raws)


def test_bad_adapter_is_a_startup_error(tmp_path):
    config = make_config(tmp_path, joiner={"adapter": "sample_adapters:nope"})
    with pytest.raises(ConfigError, match=r"\[joiner\].adapter"):
        joiner.serve(config, "a", "a-j0", eventstore="127.0.0.1:1", registry=FakeRegistry())


def test_unreachable_joiner_raises_unavailable():
    client = JoinerClient(f"127.0.0.1:{free_port()}")
    with pytest.raises(JoinerUnavailable, match="UNAVAILABLE"):
        client.join(*clicks([1]), timeout=5)
    with pytest.raises(JoinerUnavailable):
        client.join_future(*clicks([1]), timeout=5).result(timeout=10)
    client.close()


def test_nothing_is_written_before_the_commit_and_stop_finishes_in_flight_requests(stack):
    reg, s, pending = join_held_in_commit(stack, 3, roll_interval_s=60.0)
    assert s.client.status()["in_flight"] == 1
    assert not s.joined_dir.exists() or not any(f.stat().st_size for f in s.joined_dir.rglob("*.jsonl*"))
    stopping = threading.Thread(target=s.server.stop)
    stopping.start()

    def refused() -> bool:
        try:
            s.client.join(*clicks([9]), timeout=2)
        except JoinerUnavailable:
            return True
        return False

    wait_until(refused, 10, message="the stopping joiner refusing new requests")
    assert not pending.done()
    reg.gate.set()
    assert pending.result(timeout=10) == [J, J, J]
    stopping.join(timeout=20)
    assert not stopping.is_alive()
    assert not inprogress_files(s.joined_dir)
    assert sorted(e["click_id"] for e in joined_lines(s.joined_dir)) == [click_id(n) for n in range(3)]


@pytest.mark.timeout(60)
def test_status_says_where_requests_waited_store_commit_write(stack):
    """A request's wall time in the event store lookup, the registry commit and the output write is summed per
    joiner (``store_wait_us``, ``commit_wait_us``, ``write_wait_us``); a request that commits nothing adds to
    the store's alone."""
    import idregistry
    s = stack(idregistry.connect("memory://"))
    pid = fresh_click_pid()
    ids, refs, raws = clicks(range(5), pid=pid)
    assert s.client.join(ids, refs, raws) == [NF] * 5          # nothing read yet: no commit, no write
    st = s.client.status()
    assert st["store_wait_us"] > 0 and st["commit_wait_us"] == 0 and st["write_wait_us"] == 0
    store_before = st["store_wait_us"]
    write_queries(s.root, range(5))
    s.wait_queries(5)
    assert s.client.join(ids, refs, raws) == [J] * 5
    st = s.client.status()
    assert st["store_wait_us"] > store_before and st["commit_wait_us"] > 0
    assert st["write_wait_us"] > 0 and st["output_commits"] >= 1   # the write waited for a durable commit
