"""Regions at a distance on one Linux host: each region's processes in their own network namespace, with
every packet between two regions delayed by half the round trip each way (so any two regions are one full
round trip apart, TCP handshakes, gRPC and Raft alike; processes of one region talk over their own
loopback and address without delay). Needs root and ``ip``.

How the delay is made (``RegionNetwork(..., delay=...)``):

* ``"netem"``: every namespace is joined to a bridge in the root namespace by a veth link, and
  ``tc netem`` on the namespace's end delays every packet leaving it. Needs the kernel's ``sch_netem``.
* ``"relay"`` (where the kernel has no netem): the bridge and veth links stay, undelayed, for the root
  namespace's traffic with the regions (the tests' and benchmarks' own process: metrics scrapes, status);
  between regions each namespace routes the other regions' addresses (/32 routes, source its own
  address) through a TUN device whose other end is held by one relay process (:mod:`bench._wire`) in
  the root namespace, which writes each packet into the destination region's TUN half a round trip
  after reading it. The relay runs at a raised priority (as netem runs in the kernel); it dies with its
  owner (it watches a pipe), and the TUNs go with it.
* ``"auto"`` (default): netem where the kernel has it, else the relay; with ``rtt_ms == 0`` neither
  (regions talk over the bridge).

:func:`namespaces_refused` / :func:`delay_refused` say why not when the machine refuses;
:func:`delay_kind` says which delay ``"auto"`` picks.

Used by the multi-region tests and ``python -m bench.regions``::

    with RegionNetwork(["a", "b", "c"], rtt_ms=50) as net:
        net.host("a")        # the region's address, e.g. "10.213.7.10": its [[regions]].host
        net.prefix("a")      # ["ip", "netns", "exec", "<ns>"]: run a command inside the region

Every name it makes carries its owner's pid (namespaces ``photon-p<pid>r<k>-<region>``, links
``[btve]p<pid>r<k>...``); opening a network first deletes those left by owners no longer running (a run
that was SIGKILLed), so leaks never pile up or clash.
"""
from __future__ import annotations

import fcntl
import functools
import itertools
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
_ROOT = Path(__file__).resolve().parent.parent
_SERIAL = itertools.count(random.randrange(100))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def open_tun(name: str) -> int:
    """A new TUN device ``name`` (IPv4 packets without a packet-information header); returns its fd.
    The device lives while the fd is open, and the fd keeps working after the device moves namespace."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd


def namespaces_refused() -> str | None:
    """None when network namespaces joined by veth links work here; otherwise the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the 'ip' command is not installed"
    return _probe("veth")


def netem_refused() -> str | None:
    """None when ``tc netem`` delays work inside a namespace here; otherwise the reason."""
    reason = namespaces_refused()
    if reason is None and shutil.which("tc") is None:
        return "the 'tc' command is not installed"
    return reason or _probe("netem")


def relay_refused() -> str | None:
    """None when the TUN relay can join namespaces here; otherwise the reason."""
    return namespaces_refused() or _probe("tun")


def delay_kind() -> str | None:
    """``"netem"`` or ``"relay"``: how ``RegionNetwork(delay="auto")`` delays packets here (None: neither)."""
    if netem_refused() is None:
        return "netem"
    return "relay" if relay_refused() is None else None


def delay_refused() -> str | None:
    """None when regions can be placed at a real distance here (netem or the relay); otherwise why not."""
    if delay_kind() is not None:
        return None
    return f"{netem_refused()}; {relay_refused()}"


@functools.cache
def _probe(kind: str) -> str | None:
    """Why a throwaway namespace refuses ``kind`` (``"veth"``, ``"netem"``, ``"tun"``), or None; asked of
    the kernel once per process (the ``*_refused`` checks above share the answers)."""
    probe = f"phprobe{os.getpid()}"
    try:
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"ip netns add refused: {r.stderr.strip()}"
        r = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if r.returncode != 0:
            return f"veth links refused: {r.stderr.strip()}"
        if kind == "netem":
            r = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                return f"tc netem refused ({r.stderr.strip()}; the kernel lacks sch_netem)"
        if kind == "tun":
            try:
                fd = open_tun(f"tphprobe{os.getpid() % 100000}")
            except OSError as e:
                return f"TUN devices refused ({e}; the kernel needs CONFIG_TUN and /dev/net/tun)"
            try:
                r = _ip("link", "set", f"tphprobe{os.getpid() % 100000}", "netns", probe, check=False)
                if r.returncode != 0:
                    return f"moving a TUN device into a namespace refused: {r.stderr.strip()}"
            finally:
                os.close(fd)
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def delete_stale() -> list[str]:
    """Delete the namespaces and root-namespace links left by RegionNetworks whose owner process is gone;
    returns their names."""
    gone = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split(" ")[0]
        m = re.match(r"photon-p(\d+)r\d+-", name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("netns", "del", name, check=False)
            gone.append(name)
    for line in _ip("-o", "link", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        m = re.match(r"[btve]p(\d+)r\d", name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("link", "del", name, check=False)
            gone.append(name)
    return gone


class RegionNetwork:
    """Namespaces ``photon-<tag>-<region>`` on a bridge with a free 10.x.y.0/24 subnet, any two regions
    ``rtt_ms`` apart (``delay``: ``"auto"``, ``"netem"`` or ``"relay"``, see the module). ``close()`` (or
    leaving the ``with`` block) stops the relay and deletes every namespace, link and the bridge, also
    after a failure."""

    def __init__(self, regions: list[str], rtt_ms: float = 0.0, delay: str = "auto") -> None:
        if delay not in ("auto", "netem", "relay"):
            raise ValueError(f"delay must be 'auto', 'netem' or 'relay', got {delay!r}")
        if len(regions) > 10:
            raise ValueError(f"at most 10 regions, got {len(regions)}")
        self.regions = list(regions)
        self.rtt_ms = float(rtt_ms)
        if delay == "auto":
            delay = (delay_kind() or "netem") if self.rtt_ms > 0 else "none"
        self.delay = delay
        self.tag = f"p{os.getpid()}r{next(_SERIAL) % 100}"
        self.bridge = f"b{self.tag}"
        self.subnet = ""
        self.relay: subprocess.Popen | None = None
        self.wire_statistics: dict = {}     # the relay's, once closed: packets_relayed, packets_dropped, ...
        self._made_ns: list[str] = []
        self._made_bridge = False

    @staticmethod
    def _free_subnet() -> str:
        used = _ip("-o", "addr").stdout
        for _ in range(100):
            net = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
            if f" {net}." not in used:
                return net
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    def namespace(self, region: str) -> str:
        return f"photon-{self.tag}-{region}"

    def host(self, region: str) -> str:
        return f"{self.subnet}.{10 + self.regions.index(region)}"

    def prefix(self, region: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(region)]

    def open(self) -> "RegionNetwork":
        delete_stale()
        self.subnet = self._free_subnet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made_bridge = True
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, region in enumerate(self.regions):
                ns, outer, inner = self.namespace(region), f"v{self.tag}{i}", f"e{self.tag}{i}"
                _ip("netns", "add", ns)
                self._made_ns.append(ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                _ip("-n", ns, "addr", "add", f"{self.host(region)}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                if self.delay == "netem" and self.rtt_ms > 0:
                    subprocess.run([*self.prefix(region), "tc", "qdisc", "add", "dev", inner, "root", "netem",
                                    "delay", f"{self.rtt_ms / 2:g}ms", "limit", "100000"],
                                   check=True, capture_output=True, timeout=30)
            if self.delay == "relay":
                self._open_relay()
        except BaseException:
            self.close()
            raise
        return self

    def _open_relay(self) -> None:
        """One TUN per namespace, the relay holding their other ends, and /32 routes to the other regions
        through the TUN (more specific than the bridge's /24, which keeps serving the root namespace)."""
        fds = {}
        try:
            for i, region in enumerate(self.regions):
                tun = f"t{self.tag}{i}"
                fds[region] = open_tun(tun)
                ns = self.namespace(region)
                _ip("link", "set", tun, "netns", ns)
                subprocess.run([*self.prefix(region), "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0",
                                f"net.ipv4.conf.{tun}.rp_filter=0", f"net.ipv6.conf.{tun}.disable_ipv6=1"],
                               check=True, capture_output=True, timeout=30)
                _ip("-n", ns, "link", "set", tun, "up")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT),
                                                                              os.environ.get("PYTHONPATH")]))}
            self.relay = subprocess.Popen(
                [sys.executable, "-m", "bench._wire", "--delay-ms", f"{self.rtt_ms / 2:g}",
                 *(f"{fd}={self.host(r)}" for r, fd in fds.items())],
                pass_fds=list(fds.values()), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                start_new_session=True)
        finally:
            for fd in fds.values():
                os.close(fd)                 # the relay holds them now
        for i, region in enumerate(self.regions):
            for other in self.regions:
                if other != region:
                    _ip("-n", self.namespace(region), "route", "add", f"{self.host(other)}/32", "dev",
                        f"t{self.tag}{i}", "src", self.host(region))

    def close(self) -> None:
        if self.relay is not None:
            try:
                out, _ = self.relay.communicate(timeout=10)   # closes its stdin: the relay ends at end of file
                self.wire_statistics = json.loads(out.splitlines()[-1]) if out.strip() else {}
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait()
            self.relay = None
        for i, ns in enumerate(self._made_ns):
            _ip("link", "del", f"v{self.tag}{i}", check=False)   # now (a namespace's links go asynchronously)
            _ip("netns", "del", ns, check=False)
        self._made_ns = []
        if self._made_bridge:
            _ip("link", "del", self.bridge, check=False)
            self._made_bridge = False

    def __enter__(self) -> "RegionNetwork":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
