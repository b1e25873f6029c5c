"""A user-space stand-in for ``tc netem`` delay: the wire between regions' network namespaces.

Each region's namespace holds one end of a TUN device (point-to-point, no ARP, IPv4 packets without a
packet-information header) through which the namespace routes the other regions' addresses. This
program holds the other end of every TUN (file descriptors opened in the root namespace and inherited),
reads each IPv4 packet leaving a namespace, looks up its destination address (bytes 16..20 of the IPv4
header) among the regions' addresses, and writes it into the destination region's TUN ``delay_ms``
after it was read: one way, so a round trip between two regions pays ``2 * delay_ms``. One delay for
every link means one FIFO queue in arrival order keeps every link's packets in order; nothing is dropped
except packets that are not IPv4 or whose destination is no region (counted). It exits when its standard
input closes (its owner ended, even by SIGKILL) or on SIGTERM, printing its :class:`WireStatistics` as
one JSON line.

    python -m bench._wire --delay-ms 25 FD=10.1.2.10 FD=10.1.2.11 ...

The deciding core (:class:`WireQueue`: where a packet goes and when) has no clock, socket or thread; the
shell (:func:`serve`) owns the file descriptors and the epoll loop.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass

MAX_PACKET = 65536
READ_BURST = 256          # packets read from one TUN before looking at the others


@dataclass(frozen=True)
class WireStatistics:
    packets_relayed: int
    packets_dropped: int
    packets_queued: int


class WireQueue:
    """Packets in flight on the wire: ``accept(packet, now)`` files a packet leaving a namespace under the
    time it is due at its destination; ``due(now)`` yields ``(destination, packet)`` in arrival order once
    due. Destinations are whatever the caller mapped each region address (4 bytes) to."""

    def __init__(self, routes: dict[bytes, object], delay_s: float) -> None:
        self.routes = dict(routes)
        self.delay_s = float(delay_s)
        self.queue: deque = deque()
        self.relayed = 0
        self.dropped = 0
        self._undeliverable = False

    def accept(self, packet: bytes, now: float) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            self.dropped += 1          # not IPv4 (the kernel's IPv6 chatter on a fresh link, say)
            return
        dest = self.routes.get(packet[16:20])
        if dest is None:
            self.dropped += 1
            return
        self.queue.append((now + self.delay_s, dest, packet))

    def next_due(self) -> float | None:
        return self.queue[0][0] if self.queue else None

    def due(self, now: float):
        q = self.queue
        while q and q[0][0] <= now:
            _, dest, packet = q[0]
            yield dest, packet
            q.popleft()            # only once the caller took it (a write that must be retried stays first)
            if self._undeliverable:
                self.dropped += 1
                self._undeliverable = False
            else:
                self.relayed += 1

    def undeliverable(self) -> None:
        """The packet :meth:`due` just yielded could not be written (its destination is gone): it counts
        as dropped, not relayed."""
        self._undeliverable = True

    def statistics(self) -> WireStatistics:
        return WireStatistics(self.relayed, self.dropped, len(self.queue))


def serve(tuns: dict[int, str], delay_ms: float, control_fd: int | None = 0) -> WireStatistics:
    """Relay packets among the TUN file descriptors ``tuns`` (fd -> the IPv4 address of the region behind
    it) with ``delay_ms`` one way, until ``control_fd`` reaches end of file or SIGTERM arrives."""
    routes = {socket.inet_aton(addr): fd for fd, addr in tuns.items()}
    wire = WireQueue(routes, delay_ms / 1000.0)
    ep = select.epoll()
    for fd in tuns:
        os.set_blocking(fd, False)
        ep.register(fd, select.EPOLLIN)
    if control_fd is not None:
        ep.register(control_fd, select.EPOLLIN | select.EPOLLHUP)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    clock = time.monotonic
    while not stop:
        nxt = wire.next_due()
        timeout = -1 if nxt is None else max(0.0, nxt - clock())
        try:
            events = ep.poll(timeout)
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == control_fd:
                if not os.read(control_fd, 4096):
                    stop.append(True)
                continue
            now = clock()
            for _ in range(READ_BURST):
                try:
                    wire.accept(os.read(fd, MAX_PACKET), now)
                except BlockingIOError:
                    break
                except OSError:        # the namespace (and so the TUN) is gone
                    break
        _flush(wire, clock())
    ep.close()
    return wire.statistics()


def _flush(wire: WireQueue, now: float) -> None:
    for dest, packet in wire.due(now):
        try:
            os.write(dest, packet)
        except BlockingIOError:
            return                     # stays first in the queue: retried on the next turn
        except OSError:
            wire.undeliverable()       # the destination namespace is gone


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._wire", description=__doc__.splitlines()[0])
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of every packet")
    p.add_argument("tun", nargs="+", metavar="FD=ADDRESS", help="an inherited TUN fd and its region's address")
    args = p.parse_args(argv)
    tuns = {}
    for item in args.tun:
        fd, eq, addr = item.partition("=")
        if not (eq and fd.isdigit()):
            p.error(f"{item!r}: expected FD=ADDRESS")
        tuns[int(fd)] = addr
    try:
        os.nice(-10)        # the wire stands in for the kernel's netem: not starved by the regions' work
    except OSError:
        pass
    stats = serve(tuns, args.delay_ms)
    print(json.dumps(asdict(stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
