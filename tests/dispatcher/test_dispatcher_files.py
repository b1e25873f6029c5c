"""The checkpoint files: a full snapshot plus a journal of deltas; a torn last line never counts."""
from __future__ import annotations

import orjson
import pytest

from dispatcher._files import CHECKPOINT_FILE, CheckpointFiles, load_checkpoint

pytestmark = pytest.mark.timeout(30)


def snapshot(events):
    return {"format": 1, "written_at_us": 1, "offsets": {"a": 10}, "events": events, "recovered": [],
            "counters": {"joined": 0}, "join_latency_hist": {}}


def delta(at, add=(), gone=(), sent=(), dup=(), offsets=None):
    return {"written_at_us": at, "offsets": offsets or {"a": 10 + at}, "add": list(add), "recovered": [],
            "dup": list(dup), "sent": list(sent), "gone": list(gone), "counters": {"joined": at},
            "join_latency_hist": {}}


def event(i, attempts=0):
    return [i, "q" + i, '{"c":"' + i + '"}', 5, attempts, []]


def test_load_applies_the_complete_journal_lines_and_ignores_a_torn_one(tmp_path):
    files = CheckpointFiles(tmp_path)
    assert load_checkpoint(tmp_path) is None
    files.save_snapshot(snapshot([event("x"), event("y")]))
    files.append_delta(delta(2, add=[event("z")], gone=["x"], sent=["y"], dup=[["y", "copy"]]))
    files.append_delta(delta(3, sent=["y", "z"]))
    journal = tmp_path / f"checkpoint.{files.journal}.log"
    with open(journal, "ab") as f:
        f.write(orjson.dumps(delta(4, gone=["y", "z"]))[:40])     # a crash in the middle of an append
    snap = load_checkpoint(tmp_path)
    assert snap["offsets"] == {"a": 13} and snap["counters"] == {"joined": 3} and snap["written_at_us"] == 3
    assert {e[0]: (e[4], e[5]) for e in snap["events"]} == {"y": (2, ["copy"]), "z": (1, [])}
    files.close()

    again = CheckpointFiles(tmp_path, snap["journal"])              # the next run starts with a full one
    again.save_snapshot(snap)
    assert not journal.exists() and orjson.loads((tmp_path / CHECKPOINT_FILE).read_bytes())["journal"] == 2
    assert load_checkpoint(tmp_path)["events"] == snap["events"]
    again.append_delta(delta(5, gone=["y"]))
    assert [e[0] for e in load_checkpoint(tmp_path)["events"]] == ["z"]
    again.close()


def test_a_failed_append_leaves_no_partial_line_once_retried(tmp_path, monkeypatch):
    import os
    files = CheckpointFiles(tmp_path)
    files.save_snapshot(snapshot([event("x")]))
    files.append_delta(delta(2, sent=["x"]))
    real = os.fdatasync
    calls = []

    def failing(fd):
        calls.append(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        files.append_delta(delta(3, sent=["x"]))
    monkeypatch.setattr(os, "fdatasync", real)
    files.append_delta(delta(3, sent=["x"]))                        # the retry of the same delta
    snap = load_checkpoint(tmp_path)
    assert calls and snap["events"][0][4] == 2 and snap["written_at_us"] == 3
    files.close()


def random_delta(rng, at):
    """A delta as the core writes it (format 3: the lines read since as bytes, their lengths beside them; one of
    them may hold a newline), or a delta of format 2 (the lines as one string, or one by one as text when one
    holds a newline) or 1 (rows) as older dispatchers wrote them."""
    n = rng.randrange(0, 6)
    ids = [f"c{at}-{k}" for k in range(n)]
    lines = ['{"c":"%s","t":"%s"}' % (i, rng.choice(["", "é", "\\\"", "x" * rng.randrange(40)])) for i in ids]
    kind = rng.choice(["bytes", "bytes", "bytes", "list", "text", "rows"])
    if kind in ("list", "bytes") and lines and rng.random() < 0.3:
        lines[0] = lines[0].replace(",", ",\n", 1)
    raws = {"bytes": "\n".join(lines).encode(), "list": lines, "text": "\n".join(lines)}.get(kind)
    rest = {"written_at_us": at, "offsets": {"a": 10 + at}, "recovered": [], "dup": [], "sent": [f"c{at - 1}-0"],
            "gone": [], "counters": {"joined": at}, "join_latency_hist": {}}
    if kind == "rows":
        return {**rest, "add": [[i, "q" + i, ln, 5, 0, []] for i, ln in zip(ids, lines)]}
    added = {"ids": ids, "refs": ["q" + i for i in ids], "raws": raws, "first_seen": [5] * n, "attempts": [0] * n,
             "dups": {}}
    if kind == "bytes":
        added["lens"] = [len(ln.encode()) for ln in lines]
    return {"format": 3 if kind == "bytes" else 2, **rest, "added": added}


def as_text(delta):
    """The same delta as format 2 wrote it: its lines as text inside the JSON line."""
    added = delta.get("added")
    if added is None or type(added["raws"]) is not bytes:
        return delta
    from dispatcher._state import delta_events
    text = [e[2] for e in delta_events(delta)]
    return {**delta, "format": 2, "added": {**{k: v for k, v in added.items() if k != "lens"},
                                            "raws": text if any("\n" in t for t in text) else "\n".join(text)}}


@pytest.mark.parametrize("seed", range(40))
def test_a_journal_cut_anywhere_reads_its_complete_records_as_json_lines_alone_read_them(seed):
    """Random journals of deltas of all three formats (the lines as bytes after the JSON line, as text inside it,
    as rows), cut at every byte as a crash may cut the last append: the deltas read are those of the records
    written whole before the cut, each equal to the same delta written as one JSON line per delta (formats 1
    and 2, read line by line before the lines were kept as bytes) and read that way."""
    import random

    from dispatcher._files import decode_journal, encode_delta
    from dispatcher._state import delta_events
    rng = random.Random(seed)
    deltas = [random_delta(rng, at) for at in range(1, rng.randrange(2, 7))]
    records = [encode_delta(d) for d in deltas]
    for d, r in zip(deltas, records):        # bytes only where the lines are bytes; JSON lines alone otherwise
        assert (r.count(b"\n") > 1) == (type(d.get("added", {}).get("raws")) is bytes)
    data = b"".join(records)
    ends = [sum(map(len, records[:k + 1])) for k in range(len(records))]
    for cut in range(len(data) + 1):
        got = decode_journal(data[:cut])
        whole = sum(e <= cut for e in ends)
        assert got == deltas[:whole], cut
        lines = b"".join(orjson.dumps(as_text(d)) + b"\n" for d in deltas[:whole]).splitlines()
        assert [as_text(d) for d in got] == [orjson.loads(ln) for ln in lines]
        assert [delta_events(d) for d in got] == [delta_events(orjson.loads(ln)) for ln in lines]


def test_a_record_whose_lines_do_not_end_where_its_count_says_is_refused():
    from dispatcher._files import decode_journal, encode_delta
    from dispatcher._state import delta_events
    record = encode_delta({"format": 3, "written_at_us": 1, "offsets": {}, "recovered": [], "dup": [], "sent": [],
                           "gone": [], "counters": {}, "join_latency_hist": {},
                           "added": {"ids": ["a", "b"], "refs": ["qa", "qb"], "raws": b'{"c":"a"}\n{"c":"b"}',
                                     "lens": [9, 9], "first_seen": [1, 1], "attempts": [0, 0], "dups": {}}})
    assert [e[2] for e in delta_events(decode_journal(record)[0])] == ['{"c":"a"}', '{"c":"b"}']
    with pytest.raises(ValueError, match="byte count"):
        decode_journal(record.replace(b'{"c":"b"}', b'{"c":"bb"}') + b"\n")


def test_a_journal_of_records_of_every_format_loads_from_the_files(tmp_path):
    """Deltas of formats 1, 2 and 3 appended to one journal (a dispatcher of this version appends to a journal
    only after its own full snapshot, but older records must still read) load as the rows they describe."""
    files = CheckpointFiles(tmp_path)
    files.save_snapshot(snapshot([event("x"), event("y")]))
    files.append_delta(delta(2, add=[event("z")], gone=["x"]))
    files.append_delta({"format": 2, **delta(3, sent=["y"]), "add": None,
                        "added": {"ids": ["w"], "refs": ["qw"], "raws": '{"c":"w"}', "first_seen": [5], "attempts": [0],
                                  "dups": {}}})
    files.append_delta({"format": 3, **delta(4, sent=["z"]), "add": None,
                        "added": {"ids": ["v", "u"], "refs": ["qv", "qu"], "raws": b'{"c":"v"}\n{"c":"u"}',
                                  "lens": [9, 9],
                                  "first_seen": [5, 5], "attempts": [0, 0], "dups": {}}})
    snap = load_checkpoint(tmp_path)
    assert snap["written_at_us"] == 4 and snap["offsets"] == {"a": 14}
    assert snap["events"] == [["y", "qy", '{"c":"y"}', 5, 1, []], ["z", "qz", '{"c":"z"}', 5, 1, []],
                              ["w", "qw", '{"c":"w"}', 5, 0, []], ["v", "qv", '{"c":"v"}', 5, 0, []],
                              ["u", "qu", '{"c":"u"}', 5, 0, []]]
    files.close()


def test_lines_that_do_not_fill_their_bytes_are_refused():
    from dispatcher._state import delta_events
    delta = {"format": 3, "written_at_us": 1, "offsets": {}, "recovered": [], "dup": [], "sent": [], "gone": [],
             "counters": {}, "join_latency_hist": {},
             "added": {"ids": ["a", "b"], "refs": ["qa", "qb"], "raws": b'{"c":"a"}\n{"c":"b"}', "lens": [9, 8],
                       "first_seen": [1, 1], "attempts": [0, 0], "dups": {}}}
    with pytest.raises(ValueError, match="bytes"):
        delta_events(delta)
    fixed = {**delta, "added": {**delta["added"], "lens": [9, 9]}}
    assert [e[2] for e in delta_events(fixed)] == ['{"c":"a"}', '{"c":"b"}']
