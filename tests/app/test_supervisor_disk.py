"""The supervisor survives a full state disk (launcher.json is retried, never fatal) and rotates its
children's logs by size."""
from __future__ import annotations

import sys

from photon import ProcessSpec
from photon.app._supervisor import RotatingLog, Supervisor


def test_child_logs_rotate_by_size(tmp_path):
    log = RotatingLog(tmp_path / "x.log", max_bytes=100, backups=2)
    for k in range(10):
        log.write(b"%02d" % k + b"." * 38 + b"\n")      # 41 bytes a line: two lines per file
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["x.log", "x.log.1", "x.log.2"]
    assert all(p.stat().st_size <= 100 for p in tmp_path.iterdir())
    assert (tmp_path / "x.log").read_bytes().startswith(b"08")


def test_a_full_state_disk_does_not_end_the_launcher(small_disk, tmp_path):
    disk = small_disk(tmp_path / "state", "200k")
    echoed: list[str] = []
    sup = Supervisor(tmp_path / "state" / "logs", tmp_path / "state" / "launcher.json", echo=echoed.append)
    spec = ProcessSpec(name="sleeper", role="test", region="a",
                       argv=(sys.executable, "-c", "import time; print('hi', flush=True); time.sleep(60)"))
    try:
        disk.fill()
        sup.ensure([spec])                               # writing launcher.json fails: said, not raised
        assert sup.state_error and any("waiting for the disk" in m for m in echoed)
        assert sup.pid("sleeper") is not None
        disk.resize("4m")
        sup.poll()
        assert sup.state_error == "" and (tmp_path / "state" / "launcher.json").exists()
    finally:
        sup.stop(grace_s=5)
