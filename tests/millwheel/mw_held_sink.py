"""``examples.ad_windows`` whose window sink can be held inside user code, for the tests of an old sink
owner resumed after its interval moved: while the file named by ``MW_HOLD_SINK`` exists, the first sink
record a process gets after its first commit of the sink (its state's length above 0) waits there, past
the runtime's lease check, once per run (the first process to get there); ``<that file>.<pid>`` says which process waits and the
length it has committed, and ``<that file>.<pid>.done`` appears once the held record's write returned or
raised."""
from __future__ import annotations

import os
import time
from pathlib import Path

from dataclasses import replace

from millwheel import FileSink, Topology
from millwheel.examples import ad_windows

_held = False


class HeldSink(FileSink):
    def process_record(self, ctx, record) -> None:
        global _held
        hold = os.environ.get("MW_HOLD_SINK")
        committed = (ctx.state or {}).get("bytes", 0)
        if hold and not _held and committed > 0 and Path(hold).exists() and _first(hold):
            _held = True
            Path(f"{hold}.{os.getpid()}").write_text(str(committed))
            while Path(hold).exists():
                time.sleep(0.01)
            try:
                super().process_record(ctx, record)
            finally:
                Path(f"{hold}.{os.getpid()}.done").touch()
            return
        super().process_record(ctx, record)


def _first(hold: str) -> bool:
    """This process is the first of the run to hold a record (later owners of the sink are not held)."""
    try:
        os.close(os.open(f"{hold}.taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def build(input: str, out: str) -> Topology:
    t = ad_windows.build(input, out, echo=False)
    spec = t.computations["window-sink"]
    t.computations["window-sink"] = replace(spec, factory=lambda: HeldSink(Path(out) / "windows.jsonl"))
    return t
