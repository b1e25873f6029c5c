"""The tailer's line splitting (one split, offsets by a running sum, one UTF-8 check per chunk) against a
line-by-line reading of the same bytes: random contents with empty lines, CRLF, multi-byte and invalid UTF-8,
over-long lines, appended in random pieces (so polls see partial last lines) and read with random sizes."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from photon import LogTailer
from photon._logs import line_offsets
from photon._tail import KEEP_OF_LONG_LINE, _is_utf8

PIECES = [
    b'{"query_id":"10.1.0.1:1000:1795685156889376","text":"q"}', b"", b"\r", b"x", b"abc def",
    "é".encode(), "日本".encode(), "🙂".encode(),                         # valid multi-byte
    b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf0\x9f\x99",      # invalid, cut, overlong, surrogate
    b"\x80", b"\xe6\x97",                                                 # a lone continuation, a cut character
]

lines_st = st.lists(st.lists(st.sampled_from(PIECES), max_size=6).map(b"".join), max_size=40)


class Recorded:
    """A quarantine that keeps what it is given."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, int, str, bytes]] = []

    def add(self, file: str, offset: int, reason: str, raw: bytes) -> None:
        self.entries.append((file, offset, reason, raw))


def reference(content: bytes, limit: int):
    """Line by line: each complete line kept with its offset, or its quarantine entry (offset, reason)."""
    good, bad = [], []
    pos = 0
    while (nl := content.find(b"\n", pos)) >= 0:
        line = content[pos:nl]
        if len(line) > limit:
            bad.append((pos, f"line longer than max_line_bytes ({limit}); skipped"))
        else:
            try:
                line.decode("utf-8")
                good.append((pos, line))
            except UnicodeDecodeError as e:
                bad.append((pos, f"not valid UTF-8 ({e.reason} at byte {e.start})"))
        pos = nl + 1
    return good, bad, pos


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=lines_st, tail=st.lists(st.sampled_from(PIECES), max_size=4).map(b"".join),
       cuts=st.lists(st.integers(0, 1 << 12), max_size=6), read_bytes=st.integers(1, 600),
       limit=st.sampled_from([8, 40, 200, 4 << 20]))
def test_tailer_agrees_with_a_line_by_line_reading(lines, tail, cuts, read_bytes, limit):
    content = b"".join(line + b"\n" for line in lines) + tail
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "f.jsonl"
        q = Recorded()
        t = LogTailer(d, read_bytes=read_bytes, quarantine=q, max_line_bytes=limit)
        got = []
        written = 0
        for cut in sorted({min(c, len(content)) for c in cuts} | {len(content)}):
            with open(f, "ab") as fh:               # appended in pieces: polls see partial last lines
                fh.write(content[written:cut])
            written = cut
            for _ in range(len(content) + 2):        # every poll reads at least a byte until caught up
                chunks = t.poll()
                for c in chunks:
                    assert c.file == "f.jsonl" and c.end == t.offsets["f.jsonl"]
                    assert len(c.offsets) == len(c.lines)
                    if c.data is not None:           # (kept while no line of the chunk was dropped)
                        held = b"".join(line + b"\n" for line in c.lines)
                        assert c.data.startswith(held) and content[c.offsets[0]:c.end] == held
                    got += zip(c.offsets, c.lines)
                if not chunks and t.caught_up:
                    break
        good, bad, end = reference(content, limit)
        assert got == good
        complete = [(off, reason) for _, off, reason, _ in q.entries if off < end]
        assert complete == bad
        for name, off, reason, raw in q.entries:
            line = content[off:content.find(b"\n", off)] if content.find(b"\n", off) >= 0 else content[off:]
            assert name == "f.jsonl"
            if reason.startswith("not valid"):
                assert raw == line
            else:                                  # the head of an over-long line, never held whole
                assert line.startswith(raw) and len(raw) >= min(KEEP_OF_LONG_LINE, limit + 1)
        if len(tail) > limit:                        # an unfinished over-long line: quarantined at its start
            assert [off for _, off, _, _ in q.entries if off >= end] == [end]
        else:
            assert all(off < end for _, off, _, _ in q.entries)
        assert t.offsets.get("f.jsonl", 0) == end


@settings(max_examples=500, deadline=None)
@given(lines=lines_st, tail=st.binary(max_size=8).filter(lambda b: b"\n" not in b), start=st.integers(0, 1 << 40))
def test_offsets_and_the_utf8_check_agree_with_each_line(lines, tail, start):
    data = b"".join(line + b"\n" for line in lines) + tail
    split = data.split(b"\n")
    split.pop()
    assert split == lines
    expected, pos = [], start
    for line in lines:
        expected.append(pos)
        pos += len(line) + 1
    assert line_offsets(start, split) == expected
    last_nl = data.rfind(b"\n")
    if last_nl >= 0:
        def valid(line):
            try:
                line.decode("utf-8")
                return True
            except UnicodeDecodeError:
                return False
        assert _is_utf8(data, last_nl) == all(map(valid, lines))


def test_local_objects_are_named_from_the_root_however_the_root_is_written(tmp_path, monkeypatch):
    stream = tmp_path / "s"
    (stream / "w0" / "deep").mkdir(parents=True)
    (stream / "a.jsonl").write_bytes(b"{}\n")
    (stream / "w0" / "deep" / "b.jsonl").write_bytes(b"{}\n")
    monkeypatch.chdir(tmp_path)
    for root in (str(stream), str(stream) + "/", "s", "./s", "s/"):
        assert list(LogTailer(root).source.scan()) == ["a.jsonl", "w0/deep/b.jsonl"], root
    monkeypatch.chdir(stream)
    assert list(LogTailer(".").source.scan()) == ["a.jsonl", "w0/deep/b.jsonl"]
