"""A real ``moto_server`` process (S3 for benchmarks and tests) on a free 127.0.0.1 port, its output in a
log file, stopped by killing its process group."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from photon import free_port, wait_until


def moto_executable() -> Path:
    """Where ``pip install 'moto[server]'`` puts ``moto_server``: beside this Python."""
    return Path(sys.executable).parent / "moto_server"


@dataclass
class MotoServer:
    endpoint: str
    proc: subprocess.Popen
    log_path: str

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def log_text(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-3000:]


def start_moto_server() -> MotoServer:
    """Start one and wait until it answers; RuntimeError (with its log) when it exits first."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
    proc = subprocess.Popen([str(moto_executable()), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    server = MotoServer(f"http://127.0.0.1:{port}", proc, log.name)
    try:
        wait_until(lambda: proc.poll() is not None or server.answers(), 60, interval=0.1,
                   message=f"moto_server on port {port}")
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}: {server.log_text()}")
    except BaseException:
        stop_moto_server(server)
        raise
    return server


def stop_moto_server(server: MotoServer) -> None:
    if server.proc.poll() is None:
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.proc.wait(timeout=10)
    try:
        os.unlink(server.log_path)
    except FileNotFoundError:
        pass
