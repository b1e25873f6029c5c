"""Regions at a distance on one Linux host: each region's processes in its own network namespace, all
joined by a bridge in the root namespace, with ``tc netem`` delaying every packet that leaves a
namespace by half the round trip (so any two regions are one full round trip apart; processes of one
region talk over their own loopback and addresses without delay). Needs root and ``ip``/``tc``;
:func:`namespaces_refused` / :func:`netem_refused` say why not when the machine refuses.

Used by the multi-region tests and ``python -m bench.regions``::

    with RegionNetwork(["a", "b", "c"], rtt_ms=50) as net:
        net.host("a")        # the region's address, e.g. "10.213.7.10": its [[regions]].host
        net.prefix("a")      # ["ip", "netns", "exec", "<ns>"]: run a command inside the region
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def namespaces_refused() -> str | None:
    """None when network namespaces joined by veth links work here; otherwise the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the 'ip' command is not installed"
    return _probe(netem=False)


def netem_refused() -> str | None:
    """None when ``tc netem`` delays work inside a namespace here; otherwise the reason."""
    reason = namespaces_refused()
    if reason is None and shutil.which("tc") is None:
        return "the 'tc' command is not installed"
    return reason or _probe(netem=True)


def _probe(netem: bool) -> str | None:
    probe = f"phprobe{os.getpid() % 100000}"
    try:
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"ip netns add refused: {r.stderr.strip()}"
        r = _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if r.returncode != 0:
            return f"veth links refused: {r.stderr.strip()}"
        if netem:
            r = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                return f"tc netem refused ({r.stderr.strip()}; the kernel lacks sch_netem)"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


class RegionNetwork:
    """Namespaces ``<tag>-<region>`` on a bridge with a free 10.x.y.0/24 subnet; ``close()`` (or leaving
    the ``with`` block) deletes every namespace, link and the bridge, also after a failure."""

    def __init__(self, regions: list[str], rtt_ms: float = 0.0) -> None:
        self.regions = list(regions)
        self.rtt_ms = float(rtt_ms)
        self.tag = f"ph{os.getpid() % 100000}{random.randrange(10)}"
        self.bridge = f"br{self.tag}"
        self.subnet = self._free_subnet()
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
        return f"{self.tag}-{region}"

    def host(self, region: str) -> str:
        return f"{self.subnet}.{10 + self.regions.index(region)}"

    def prefix(self, region: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(region)]

    def open(self) -> "RegionNetwork":
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
                if self.rtt_ms > 0:
                    subprocess.run([*self.prefix(region), "tc", "qdisc", "add", "dev", inner, "root", "netem",
                                    "delay", f"{self.rtt_ms / 2:g}ms", "limit", "100000"],
                                   check=True, capture_output=True, timeout=30)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for ns in self._made_ns:
            _ip("netns", "del", ns, check=False)     # deletes the namespace's end of its veth, and so both
        self._made_ns = []
        if self._made_bridge:
            _ip("link", "del", self.bridge, check=False)
            self._made_bridge = False

    def __enter__(self) -> "RegionNetwork":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
