"""The fork server: services start from one process that has imported their modules already.

Every service process of ``photon run`` is ``python -m <room>.main ...``, and each spent 0.1-0.2 s of CPU
importing the same modules (gRPC, protobuf, pysyncobj, the base, its room) while eight of them started at
once on a few cores. The launcher now starts one fork server first (``python -m photon.app._forkserver``,
in parallel with its own planning); it imports :data:`PRELOAD` once and forks each service on request,
so a service starts with its imports done and runs its main module as ``python -m`` would
(:func:`runpy._run_module_as_main`, the same call ``-m`` makes).

What comes first on the way to the first join: ``photon run`` starts its fork server before its own imports
and config (:func:`start_early`; printing into a memory file, its log placed only once the launcher holds
its state dirs, so a launcher refused for a held region writes nothing there), and the fork server serves
as soon as :data:`PRELOAD_FIRST` (the base and the registry's room: the registry's replicas are started
first) is imported, importing :data:`PRELOAD_LATER` while it serves (a request for one of those modules
imports it first).

Why the fork is safe:

* The fork server never starts a thread, a gRPC channel or server, a Raft node or a metrics server: it
  only imports. It checks that it is single-threaded (``/proc/self/task``) after importing and refuses to
  serve otherwise (the launcher then starts processes as before). gRPC's core is initialised by its first
  channel or server (``grpc_init``), not by ``import grpc``, and its optional fork support
  (``GRPC_ENABLE_FORK_SUPPORT``, off by default) only matters to a process that forks *after* using gRPC;
  gRPC's own guidance for multiprocessing servers is this pattern: import in the parent, create every
  channel and server after the fork in the child. pysyncobj starts its threads and sockets when a
  ``SyncObj`` is created, never on import.
* A forked service gets exactly the environment it asked for (``os.environ`` replaced), a new session,
  ``/dev/null`` on stdin and the launcher's pipe on stdout/stderr, default signal handlers, and the
  interpreter's own after-fork hooks (``random`` reseeded, ``logging``'s locks renewed). What differs from a
  fresh interpreter: its command line (``/proc/<pid>/cmdline``) is the fork server's (its ``comm``, as
  ``ps -o comm`` shows, is its room's name) and it shares the fork server's string-hash seed. A module
  that reads the environment when imported would see the fork server's: so only a request whose
  environment differs from the fork server's in the per-process keys the supervisor adds
  (:data:`PER_PROCESS_ENV`) is forked; any other is started as before.

Supervision (the launcher's side, :class:`ForkServer`): the fork server answers each request with the
child's pid and a pidfd (``pidfd_open``) passed over the socket, reaps its children and sends each exit
status (as ``subprocess`` reports it: the exit code, or minus the signal). :class:`ForkedProcess` offers
the part of :class:`subprocess.Popen` the supervisor uses (``pid``, ``stdout``, ``poll``, ``wait``,
``send_signal``, ``kill``, ``returncode``), signalling through the pidfd so a pid reused after the child
was reaped is never hit. Children die with the fork server (``PR_SET_PDEATHSIG``), which dies with the
launcher, as directly started children died with it before. If the fork server dies, the exit status of
each child it had is lost (:data:`STATUS_LOST`; the pidfd still says when the child has ended) and the
supervisor starts processes as before from then on.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PRELOAD_FIRST = ("grpc", "google.protobuf", "pysyncobj", "photon", "photon._config", "photon._service",
                 "prometheus_client", "photon._metrics", "idregistry.main")
"""What the fork server imports before it serves: gRPC, protobuf and pysyncobj, the base, the metrics' stack
and the registry's main module (the registry's replicas are started first: the first join needs them)."""

PRELOAD_LATER = ("eventstore.main", "joiner.main", "dispatcher.main")
"""The other rooms' main modules: imported while the fork server serves, whenever no request waits, or at
once when a request asks for one of them (so every service still starts with its imports done)."""

PRELOAD = PRELOAD_FIRST + PRELOAD_LATER
"""Everything the fork server imports: the base, every service room's main module (which imports its
server) and the metrics' stack."""

PER_PROCESS_ENV = frozenset({"PHOTON_REGION", "PHOTON_PROCESS", "PHOTON_METRICS_ADDR"})
"""Environment keys a forked service may have that differ from the fork server's (read at run time only)."""

STATUS_LOST = 256
"""``returncode`` of a forked process that ended after its fork server died: its status is not known."""

REPLY_TIMEOUT_S = 60.0
"""How long the launcher waits for the fork server to answer a request (its first answer comes after it
has imported :data:`PRELOAD`, a second or more on a busy machine)."""

_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15
_MAX_MESSAGE = 1 << 20


def _prctl(option: int, arg) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0)
    except OSError:
        pass


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


# --- the fork server's own process -------------------------------------------------------------------------

class _Job:
    """What a forked child runs: set up in :func:`_become`, then ``python -m`` of ``argv[2]``."""

    def __init__(self, argv: list, env: dict, cwd: str | None, out_fd: int, close_fds: list, server: int) -> None:
        self.argv, self.env, self.cwd, self.out_fd, self.close_fds = argv, env, cwd, out_fd, close_fds
        self.server = server          # the fork server's pid


def _send(sock: socket.socket, message: dict, fds=()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


class _Preloader:
    """The modules still to import (:data:`PRELOAD_LATER`), one at a time. Once importing one leaves a
    thread behind, :attr:`unsafe` says why and nothing more is forked."""

    def __init__(self, names) -> None:
        self.pending = list(names)
        self.unsafe = ""

    def next(self) -> None:
        self._load(self.pending[0])

    def ensure(self, module: str) -> None:
        """Before forking ``module``: import it if it is still to come; for a module of neither
        :data:`PRELOAD_FIRST` nor :data:`PRELOAD_LATER`, import everything still to come (it may use any)."""
        if module in self.pending:
            self._load(module)
        elif module not in PRELOAD:          # (a module of PRELOAD_LATER imported already needs nothing)
            while self.pending:
                self.next()

    def _load(self, name: str) -> None:
        self.pending.remove(name)
        import importlib
        try:
            importlib.import_module(name)
        except ImportError:
            pass                  # the forked service imports it itself, and fails as ``python -m`` would
        gc.freeze()               # what it imported is shared with the children to come (see main)
        threads = _thread_count()
        if threads != 1 and not self.unsafe:
            self.unsafe = f"{threads} threads after importing {name} (forking is safe with one only)"
            _say(f"fork server: {self.unsafe}; the launcher starts processes itself")
        if not self.pending:
            gc.enable()           # its own garbage from now on (its imports are frozen: never walked)
            _say(f"fork server: preloaded {len(sys.modules)} modules ({time.process_time():.3f} CPU-s)")


def _place_log(fd: int) -> None:
    """Write what this process has printed so far (into the memory file it was started with) to its log,
    ``fd``, and print into the log from now on."""
    sys.stdout.flush()
    sys.stderr.flush()
    offset = 0
    while chunk := os.pread(1, 65536, offset):
        os.write(fd, chunk)
        offset += len(chunk)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _serve(sock: socket.socket, preload: _Preloader | None = None) -> _Job | None:
    """The fork server's loop: fork on each request, report each child's exit; import what ``preload``
    still holds whenever no request waits. Returns ``None`` when the launcher has closed the socket; returns
    the job in a forked child."""
    preload = preload or _Preloader(())
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server = os.getpid()
    requests: dict[int, int] = {}          # pid of a running child -> the request that forked it
    while True:
        _reap(sock, requests)
        try:
            ready, _, _ = select.select([sock, wake_r], [], [], 0 if preload.pending else None)
        except InterruptedError:
            continue
        if not ready:                      # nothing waits: import the next module
            preload.next()
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        if sock not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 4)
        except ConnectionResetError:
            data, fds = b"", []
        if not data:
            return None
        request = json.loads(data)
        if "log" in request:               # the launcher holds its state dirs now: here is the log
            _place_log(fds[0])
            continue
        preload.ensure(request["argv"][2])
        if preload.unsafe:
            for fd in fds:
                os.close(fd)
            _send(sock, {"id": request["id"], "error": preload.unsafe})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:                   # no memory or no pids left: the launcher tries it directly
            for fd in fds:
                os.close(fd)
            _send(sock, {"id": request["id"], "error": f"fork failed: {e}"})
            continue
        if pid == 0:
            return _Job(request["argv"], request["env"], request.get("cwd"), fds[0], [wake_r, wake_w, *fds[1:]],
                        server)
        for fd in fds:
            os.close(fd)
        requests[pid] = request["id"]
        pidfd = os.pidfd_open(pid)
        try:
            _send(sock, {"id": request["id"], "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)


def _reap(sock: socket.socket, requests: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            _send(sock, {"exit": requests.pop(pid, None), "code": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass                   # the launcher is gone; this process ends with it


def _become(job: _Job) -> None:
    """In the forked child: a process of its own, as the supervisor would have started it."""
    os.setsid()
    _die_with_parent()
    if os.getppid() != job.server:          # the fork server died before the death signal was armed
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in job.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(job.out_fd, 1)
    os.dup2(job.out_fd, 2)
    os.close(job.out_fd)
    gc.enable()                             # as in a fresh interpreter (the fork server's is off, see main)
    os.environ.clear()
    os.environ.update(job.env)
    if job.cwd:
        os.chdir(job.cwd)
    module = job.argv[2]
    _prctl(_PR_SET_NAME, ctypes.c_char_p(module.split(".")[0].encode()[:15]))
    sys.argv = [module, *job.argv[3:]]


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except OSError:
        pass                       # its log's disk is full: it serves all the same


def _refuse(sock: socket.socket, reason: str) -> int:
    _say(f"fork server: {reason}; the launcher starts processes itself")
    try:
        _send(sock, {"refused": reason})
    except OSError:
        pass
    return 3


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[args.index("--fd") + 1]))
    t0 = time.process_time()
    # The collector is off while it imports (imports make hardly any cyclic garbage, and collections during
    # them are a tenth of their CPU) and what it imported is frozen before it forks (``gc.freeze``: no
    # collection, here or in a child, walks those objects, so a child's collections do not copy the pages it
    # shares with this process); a child turns it on again at once (:func:`_become`). Python's own advice
    # for a process that forks without exec (the ``gc.freeze`` documentation).
    gc.disable()
    import importlib
    for name in PRELOAD_FIRST:
        try:
            importlib.import_module(name)
        except ImportError as e:
            return _refuse(sock, f"cannot import {name}: {e}")
    gc.freeze()
    threads = _thread_count()
    if threads != 1:
        return _refuse(sock, f"{threads} threads after importing (forking is safe with one only)")
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as e:
        return _refuse(sock, f"no pidfd on this system ({e})")
    _say(f"fork server serving on its socket ({len(sys.modules)} modules imported in "
         f"{time.process_time() - t0:.3f} CPU-s; at monotonic {time.monotonic():.3f})")
    job = _serve(sock, _Preloader(PRELOAD_LATER))
    sock.close()                          # in a forked child too: the launcher's socket is the fork server's
    if job is None:
        return 0
    _become(job)
    import runpy
    sys.modules.pop(job.argv[2], None)    # imported here for its imports; ``-m`` runs it afresh as __main__
    runpy._run_module_as_main(job.argv[2], alter_argv=True)
    return 0


# --- the launcher's side ---------------------------------------------------------------------------------

class ForkServerUnavailable(OSError):
    """The fork server cannot start this process (it refused, died or did not answer); start it directly."""


class ForkServer:
    """The launcher's handle on its fork server: started by :meth:`start` (at once, so it imports while the
    launcher plans), asked for processes by :meth:`spawn`, closed by :meth:`close` (after its children have
    stopped: they die with it). Thread-safe."""

    def __init__(self, env: dict | None, log_path=None, echo=None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.log_path = log_path
        self.echo = echo or (lambda msg: None)
        self.proc: subprocess.Popen | None = None
        self.broken = ""                 # why it serves no more ("" while it does)
        self.exits: dict[int, int] = {}  # request id -> its child's exit status, reported, not yet collected
        self._sock: socket.socket | None = None
        self._lock = threading.RLock()
        self._next_id = 0
        self._log_placed = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start the fork server process (it imports :data:`PRELOAD`, then serves); a failure to start it
        leaves :attr:`broken` set, and processes are started directly. A fork server started without a
        log (:func:`start_early`) prints into a memory file until a later call, given :attr:`log_path`,
        hands it its log (it copies what it printed there first)."""
        with self._lock:
            if self.broken:
                return
            if self.proc is None:
                self._spawn_server()
            if self.log_path is not None and not self._log_placed and self._sock is not None:
                self._log_placed = True
                try:
                    os.makedirs(os.path.dirname(str(self.log_path)) or ".", exist_ok=True)
                    fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                except OSError as e:
                    self.echo(f"the fork server's log {self.log_path}: {e}; it prints nowhere")
                    return
                try:
                    _send(self._sock, {"log": True}, [fd])
                except OSError:
                    pass                     # it has ended: the next request says so
                finally:
                    os.close(fd)

    def _spawn_server(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if self.log_path is None:
                out = os.memfd_create("forkserver-log")
            else:
                os.makedirs(os.path.dirname(str(self.log_path)) or ".", exist_ok=True)
                out = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                self._log_placed = True
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "photon.app._forkserver", "--fd", str(theirs.fileno())],
                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent, env=self.env)
            finally:
                os.close(out)
        except OSError as e:
            ours.close()
            self._break(f"cannot start the fork server: {e}")
            return
        finally:
            theirs.close()
        self._sock = ours

    def can_fork(self, argv, env: dict) -> bool:
        """True when ``argv`` is ``python -m <module> ...`` of this interpreter and ``env`` differs from the
        fork server's only in :data:`PER_PROCESS_ENV`, and the fork server serves."""
        if self.broken or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m" or argv[2].startswith("-"):
            return False
        keys = (set(env) | set(self.env)) - PER_PROCESS_ENV
        return all(env.get(k) == self.env.get(k) for k in keys)

    def spawn(self, argv, env: dict, stdout_fd: int, cwd: str | None = None) -> ForkedProcess:
        """Fork ``argv`` with ``env``, its stdout and stderr on ``stdout_fd`` (the caller closes its copy).
        Raises :class:`ForkServerUnavailable` when the fork server cannot."""
        result = self.spawn_many([(argv, env, stdout_fd, cwd)])[0]
        if isinstance(result, ForkServerUnavailable):
            raise result
        return result

    def spawn_many(self, requests) -> list:
        """Fork each ``(argv, env, stdout_fd, cwd)`` of ``requests``, in order; the caller closes its copies
        of the fds. Every request is sent before any answer is awaited, so the fork server forks them one
        after the other as they come (it imports a module still to come between two requests only when
        none waits: asked one at a time, each next request would wait behind such an import). Returns, per
        request, its :class:`ForkedProcess` or the :class:`ForkServerUnavailable` that says why the fork
        server could not fork it (start that one directly)."""
        with self._lock:
            self.start()
            results: list = [None] * len(requests)
            sent: dict[int, int] = {}            # request id -> its index in ``requests``
            for k, (argv, env, stdout_fd, cwd) in enumerate(requests):
                if self.broken or self._sock is None:
                    results[k] = ForkServerUnavailable(self.broken or "no fork server")
                    continue
                self._next_id += 1
                try:
                    _send(self._sock, {"id": self._next_id, "argv": list(argv), "env": env, "cwd": cwd},
                          [stdout_fd])
                except OSError as e:
                    self._break(f"the fork server does not listen: {e}")
                    results[k] = ForkServerUnavailable(self.broken)
                    continue
                sent[self._next_id] = k
            deadline = time.monotonic() + REPLY_TIMEOUT_S
            while sent:
                message, fds = self._receive(max(0.0, deadline - time.monotonic()))
                if message is None:
                    if not self.broken:
                        self._break(f"the fork server did not answer in {REPLY_TIMEOUT_S:.0f} s")
                    for k in sent.values():
                        results[k] = ForkServerUnavailable(self.broken)
                    break
                k = sent.pop(message.get("id"), None)
                if k is None:                     # an answer to no request waiting (none is expected)
                    for fd in fds:
                        os.close(fd)
                elif "error" in message:
                    results[k] = ForkServerUnavailable(message["error"])
                else:
                    results[k] = ForkedProcess(self, requests[k][0], message["pid"], fds[0], message["id"])
            return results

    def collect(self, timeout: float = 0.0) -> None:
        """Take in the exit statuses the fork server has sent (waiting up to ``timeout`` for one)."""
        with self._lock:
            if self._sock is not None and not self.broken:
                self._receive(timeout, until_exit=True)

    def _receive(self, timeout: float, until_exit: bool = False):
        """Read messages for up to ``timeout`` seconds: exit statuses go to :attr:`exits`; the first other
        message is returned with its fds. ``(None, [])`` on timeout, a closed socket or a refusal."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._sock], [], [], max(0.0, left))
            if not ready:
                return None, []
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, _MAX_MESSAGE, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                self._break("the fork server has ended" + self._exit_note())
                return None, []
            message = json.loads(data)
            if "exit" in message:
                self.exits[message["exit"]] = message["code"]
                if until_exit:
                    timeout, deadline = 0.0, time.monotonic()
                continue
            if "refused" in message:
                self._break(f"the fork server refused: {message['refused']}")
                return None, []
            return message, fds

    def _exit_note(self) -> str:
        if self.proc is None:
            return ""
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return ""
        return f" (status {code})"

    def _break(self, reason: str) -> None:
        self.broken = reason
        self.echo(f"{reason}; starting processes directly from now on")

    def close(self) -> None:
        """Close the socket: the fork server ends (and with it any child still running: close it after
        the children have stopped)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if not self.broken:
                self.broken = "closed"
            if self.proc is not None and self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)


_early: ForkServer | None = None


def checkout_env(env: dict) -> dict:
    """``env`` with this checkout first on ``PYTHONPATH`` (the environment every process Photon starts has)."""
    env = dict(env)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_early() -> None:
    """Start ``photon run``'s fork server before the launcher has imported anything or read its config,
    with this process's environment (:func:`checkout_env`) and no log: it prints into a memory file, and
    nothing is written anywhere until a launcher holding its state dirs takes it (:func:`take_early`) and
    starts it (:meth:`ForkServer.start` places its log). Not taken, it ends with :func:`discard_early` or
    with this process."""
    global _early
    if _early is None:
        _early = ForkServer(checkout_env(os.environ))
        _early.start()


def take_early(env: dict, log_path, echo=None) -> ForkServer | None:
    """The fork server :func:`start_early` started, for a launcher whose services' environment is ``env``
    (its log to be ``log_path``); ``None`` (and that fork server closed) when there is none or its
    environment differs (a module reading the environment at import would see the wrong one)."""
    global _early
    server, _early = _early, None
    if server is None:
        return None
    if server.broken or server.env != env:
        _end_unused(server)
        return None
    server.log_path = log_path
    server.echo = echo or server.echo
    return server


def discard_early() -> None:
    """Close the fork server :func:`start_early` started if no launcher took it."""
    global _early
    server, _early = _early, None
    if server is not None:
        _end_unused(server)


def _end_unused(server: ForkServer) -> None:
    """End a fork server that has forked nothing yet (without waiting for its imports)."""
    if server.proc is not None and server.proc.poll() is None:
        server.proc.kill()
    server.close()


class ForkedProcess:
    """A service the fork server forked, with the part of :class:`subprocess.Popen` the supervisor uses.
    Signals go through its pidfd; its exit status comes from the fork server (:data:`STATUS_LOST` when the
    fork server died before reporting it)."""

    def __init__(self, server: ForkServer, argv, pid: int, pidfd: int, request: int) -> None:
        self.server, self.args, self.pid, self._pidfd = server, list(argv), pid, pidfd
        self._request = request          # statuses are matched by request, never by a pid that may be reused
        self.returncode: int | None = None
        self.stdout = None
        self.forked = True

    def _ended(self) -> bool:
        ready, _, _ = select.select([self._pidfd], [], [], 0)
        return bool(ready)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect()
            self._settle()
        return self.returncode

    def _settle(self) -> None:
        code = self.server.exits.pop(self._request, None)
        if code is None and self.server.broken and self._ended():
            code = STATUS_LOST
        if code is not None:
            self.returncode = code
            os.close(self._pidfd)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if self.server.broken:
                select.select([self._pidfd], [], [], left)
            else:
                self.server.collect(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:
            signal.pidfd_send_signal(self._pidfd, sig)
        except ProcessLookupError:
            pass                                    # ended; its status is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
