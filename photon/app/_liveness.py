"""Which joiner processes may still write: the question recovery must answer before deleting an id.

A registry token is ``<host:port>/<pid>/<start_us>/<seq>`` (see joiner/_shell.py); its *prefix*
``<host:port>/<pid>/<start_us>`` names one joiner process. :func:`judge` is the pure rule (three verdicts:
:data:`ALIVE`, :data:`STOPPED`, :data:`UNSEEN`); :func:`observe` gathers what it needs (processes of this
host, the joiners' status files) at one moment.

The rule, erring towards "alive" (an alive verdict only ever stops a delete):

* a joiner on this host is alive while a process with its pid exists, is not a zombie, and was created no
  later than the joiner's start time (+1 s for clock granularity); a pid reused by a later process does not
  count. A stopped (SIGSTOP) joiner is alive.
* a joiner on another host is alive unless its status file (``<state_dir>/joiners/<name>.json``, rewritten
  about once a second while it runs) names its address and pid and was last written more than
  ``grace_us`` ago; with no status file at all it is *unseen*.
* a token that does not parse names an *unseen* joiner.

An unseen joiner is never judged stopped; verify and recover treat its lost ids as recoverable only once
they were registered longer ago than ``[verify].lost_after_s`` (see :mod:`photon.app._verify`).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import orjson

START_SLACK_US = 1_000_000
ALIVE, STOPPED, UNSEEN = "alive", "stopped", "unseen"


@dataclass(frozen=True)
class JoinerId:
    address: str
    pid: int
    start_us: int

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]


def parse_prefix(prefix: str) -> JoinerId | None:
    """``host:port/pid/start_us`` (a token without its ``/seq``), or None when it is not one."""
    parts = prefix.split("/")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return JoinerId(parts[0], int(parts[1]), int(parts[2]))


def token_prefix(token: str) -> str:
    return token.rsplit("/", 1)[0]


@dataclass(frozen=True)
class Observation:
    """What was seen at ``now_us``: ``processes[pid] = (create_us, zombie)`` of this host's processes that
    were asked about, ``local_hosts`` (names and addresses of this host), ``statuses[(address, pid)] =
    written_at_us`` from every region's joiner status files."""
    now_us: int
    local_hosts: frozenset
    processes: dict
    statuses: dict


def judge(prefix: str, seen: Observation, grace_us: int) -> str:
    """:data:`ALIVE`, :data:`STOPPED` or :data:`UNSEEN` (see the module docstring)."""
    joiner = parse_prefix(prefix)
    if joiner is None:
        return UNSEEN
    if joiner.host in seen.local_hosts:
        proc = seen.processes.get(joiner.pid)
        if proc is None:
            return STOPPED
        create_us, zombie = proc
        return ALIVE if not zombie and create_us <= joiner.start_us + START_SLACK_US else STOPPED
    written = seen.statuses.get((joiner.address, joiner.pid))
    if written is None:
        return UNSEEN
    return ALIVE if seen.now_us - written <= grace_us else STOPPED



def local_hosts() -> frozenset:
    names = {"127.0.0.1", "localhost", "::1", "0.0.0.0", socket.gethostname()}
    try:
        names.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    return frozenset(names)


def read_joiner_statuses(state_dirs) -> dict:
    out = {}
    for state_dir in state_dirs:
        for p in sorted((Path(state_dir) / "joiners").glob("*.json")):
            try:
                d = orjson.loads(p.read_bytes())
                out[(d["address"], int(d["pid"]))] = int(d["written_at_us"])
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return out


def observe(prefixes, state_dirs, now_us: int) -> Observation:
    """Look at this host's processes named by ``prefixes`` and every region's joiner status files now."""
    import psutil
    processes = {}
    for prefix in prefixes:
        joiner = parse_prefix(prefix)
        if joiner is None or joiner.pid in processes:
            continue
        try:
            p = psutil.Process(joiner.pid)
            processes[joiner.pid] = (int(p.create_time() * 1e6), p.status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            processes[joiner.pid] = (0, False)        # exists, cannot be looked at: alive
    return Observation(now_us, local_hosts(), processes, read_joiner_statuses(state_dirs))


def verdicts(prefixes, state_dirs, now_us: int, grace_us: int) -> dict[str, str]:
    """``{prefix: ALIVE | STOPPED | UNSEEN}`` for ``prefixes``, as seen now."""
    prefixes = list(prefixes)
    seen = observe(prefixes, state_dirs, now_us)
    return {p: judge(p, seen, grace_us) for p in prefixes}

