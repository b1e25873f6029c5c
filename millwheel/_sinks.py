"""Writing a stream to a JSON-lines file exactly once.

:class:`FileSink` is a computation whose state is the length of the file it has committed. Processing a
record first cuts the file back to that length (dropping whatever a crashed run wrote after its last
commit), then appends the record's line and advances the length; the length is committed atomically
with the record's id. A re-run after a crash therefore rewrites exactly what was not committed, and the
file ends up holding every record's line once. Route every record to one key (the default key
extractor of :meth:`FileSink.consumes` does) so one thread owns the file.

The store fences an old owner of the sink's interval (moved to another process, or the run restarted):
its commits are refused. Its writes to the file are fenced here, by the same sequencer (``ctx.sequencer``):
the largest sequencer that has written is kept in a fence file beside the output
(``.<name>.fence``) with the identity of the store it belongs to (``ctx.store_id``), and every write
checks it and writes under an exclusive ``flock`` of that file, so no write of an owner whose sequencer is
smaller lands once a newer owner has written. A fence of another store (the store replaced, or another one
pointed at the same output: its sequencers start again from 1) is not compared with: the first write under
this store's sequencers takes the fence over, and the file is cut back to this store's committed length as
after a crash. Without it an old
owner stopped (SIGSTOP, a long pause) in the middle of a batch and resumed after its interval moved cut
the file back to the length it had committed, removing lines the new owner had committed since, and
wrote its own uncommitted ones in their place. Its lines written before the new owner's first write are
uncommitted ones past the committed length, which that first write cuts off, as after a crash.
"""
from __future__ import annotations

import errno
import fcntl
import os
import sys
from pathlib import Path

import orjson

from millwheel._model import Computation, Context, OutputFailed, Record, Timer

SINK_KEY = "sink"


class StaleSinkOwner(Exception):
    """A :class:`FileSink` write under a sequencer older than one that has written the file already: this
    owner has lost the sink's interval, and its commit will be refused. Nothing is written; the record
    goes back to the newer owner with the refusal."""


class FileSink(Computation):
    def __init__(self, path: str | Path, echo: bool = False) -> None:
        self.path = Path(path)
        self.fence_path = self.path.with_name(f".{self.path.name}.fence")
        self.echo = echo

    @staticmethod
    def key(record: Record) -> str:
        """The key extractor to consume a stream with: everything to one key."""
        return SINK_KEY

    def process_record(self, ctx: Context, record: Record) -> None:
        committed = (ctx.state or {}).get("bytes", 0)
        line = orjson.dumps(record.value) + b"\n"
        sequencer = getattr(ctx, "sequencer", None)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if sequencer is None:          # run without an interval (the pure runner): nothing to fence
                self._write(committed, line)
            else:
                self._fenced_write(getattr(ctx, "store_id", None), sequencer, committed, line)
        except OSError as e:   # not the record's fault: stop, and write it at the next start (no set-aside)
            raise OutputFailed(f"writing {self.path} failed: {e.strerror or e}") from e
        ctx.state = {"bytes": committed + len(line)}
        if self.echo:
            sys.stdout.write(line.decode())
            sys.stdout.flush()

    def _write(self, committed: int, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, committed)
            _pwrite_all(fd, line, committed)
        finally:
            os.close(fd)

    def _fenced_write(self, store_id: str | None, sequencer: int, committed: int, line: bytes) -> None:
        """The write of :meth:`_write`, under an exclusive lock of the fence file, if no newer sequencer of
        the same store has written (the fence records this one when it is newer, or when the fence is
        another store's). The lock is held for a few system calls; a process stopped inside them delays the
        next write to the file until it resumes or ends."""
        mine = (store_id or "-").encode()
        fence = os.open(self.fence_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fence, fcntl.LOCK_EX)
            fenced_store, _, raw = os.pread(fence, 128, 0).strip().rpartition(b" ")
            fenced_store = fenced_store.strip()
            newest = int(raw) if raw and fenced_store == mine else 0
            if newest > sequencer:
                raise StaleSinkOwner(f"{self.path} is written under sequencer {newest}; this owner's "
                                     f"{sequencer} is older (its interval moved): nothing written")
            if newest < sequencer or fenced_store != mine:
                # one write, padded to a fixed width: never a fence half replaced
                _pwrite_all(fence, b"%-64s %020d\n" % (mine, sequencer), 0)
            self._write(committed, line)
        finally:
            os.close(fence)             # (releases the lock)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        pass


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """``data`` written at ``offset``; a short write is continued (a full disk then raises ``ENOSPC``)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, "no byte written")
        view, offset = view[n:], offset + n
