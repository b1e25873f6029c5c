"""Writing a stream to a JSON-lines file exactly once.

:class:`FileSink` is a computation whose state is the length of the file it has committed. Processing a
record first cuts the file back to that length (dropping whatever a crashed run wrote after its last
commit), then appends the record's line and advances the length; the length is committed atomically
with the record's id. A re-run after a crash therefore rewrites exactly what was not committed, and the
file ends up holding every record's line once. Route every record to one key (the default key
extractor of :meth:`FileSink.consumes` does) so one thread owns the file.
"""
from __future__ import annotations

import sys
from pathlib import Path

import orjson

from millwheel._model import Computation, Context, OutputFailed, Record, Timer

SINK_KEY = "sink"


class FileSink(Computation):
    def __init__(self, path: str | Path, echo: bool = False) -> None:
        self.path = Path(path)
        self.echo = echo

    @staticmethod
    def key(record: Record) -> str:
        """The key extractor to consume a stream with: everything to one key."""
        return SINK_KEY

    def process_record(self, ctx: Context, record: Record) -> None:
        committed = (ctx.state or {}).get("bytes", 0)
        line = orjson.dumps(record.value) + b"\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                f.truncate(committed)
                f.write(line)
                f.flush()
        except OSError as e:   # not the record's fault: stop, and write it at the next start (no set-aside)
            raise OutputFailed(f"writing {self.path} failed: {e.strerror or e}") from e
        ctx.state = {"bytes": committed + len(line)}
        if self.echo:
            sys.stdout.write(line.decode())
            sys.stdout.flush()

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        pass
