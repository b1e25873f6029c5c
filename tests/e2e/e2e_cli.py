"""Running ``photon`` commands in the test's process, for the verify/recover end-to-end tests."""
from __future__ import annotations

import json

from photon.app import cli

KILL_ENV = "PHOTON_TEST_KILL_AFTER_COMMIT"
"""Set to a marker file's path: a joiner exits right after its next commit and names the batch there."""


def run_cli(capsys, *argv) -> tuple[int, dict | None, str]:
    """``photon ARGV``: its exit code, the JSON object on its last line of output (if any) and its stderr."""
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return code, (json.loads(last) if last.startswith("{") else None), err
