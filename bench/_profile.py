"""py-spy profiles of the benchmarks' processes: one ``py-spy record`` per Python process of a tree, and a
summary of the collapsed stacks it writes (top frames by own samples and by samples below them).

py-spy is a PyPI package (``pip install py-spy``); without it, :class:`Profiler` says so once and does nothing.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

PYSPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


class Profiler:
    """Starts ``py-spy record`` (raw collapsed stacks, ``rate`` samples/s; with ``gil`` only samples of the
    thread holding the GIL, i.e. where the interpreter's time goes) on each new pid handed to :meth:`attach`; the recorders stop when their process exits or :meth:`stop` is called."""

    def __init__(self, out: Path, rate: int = 100, gil: bool = False) -> None:
        self.out, self.rate, self.gil = Path(out), rate, gil
        self.out.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen] = {}
        self.available = Path(PYSPY).exists()
        if not self.available:
            print(f"(no py-spy at {PYSPY}: no profiles)", file=sys.stderr)

    def attach(self, pid: int, kind: str) -> None:
        if not self.available or pid in self.procs:
            return
        path = self.out / f"{kind}-{pid}.txt"
        self.procs[pid] = subprocess.Popen([PYSPY, "record", "-p", str(pid), "-r", str(self.rate), "-f", "raw",
                                            "-o", str(path), "--nonblocking", *(["--gil"] if self.gil else [])],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(2)       # SIGINT: py-spy writes its file and exits
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _frame(text: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"
    name, _, where = text.partition(" (")
    file = where.rsplit(":", 1)[0].rstrip(")")
    parts = Path(file).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else file
    return f"{name} ({short})"


def summarize(path: Path, top: int = 12) -> str:
    """The top frames of one collapsed-stack file: own samples (where the time is spent) and inclusive."""
    own, incl, total = Counter(), Counter(), 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        # drop the thread's name frame py-spy puts first when it has one
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    if not total:
        return f"{Path(path).name}: no samples\n"
    lines = [f"{Path(path).name}: {total} samples"]
    lines.append("  own  | frame")
    for f, n in own.most_common(top):
        lines.append(f"  {100 * n / total:4.1f}% | {f}")
    lines.append("  incl | frame")
    for f, n in incl.most_common(top):
        lines.append(f"  {100 * n / total:4.1f}% | {f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        for p in sorted(Path(arg).glob("*.txt")) if Path(arg).is_dir() else [Path(arg)]:
            print(summarize(p))
