"""The wire of a network test bed (runtime.netbed): an Ethernet switch in one process whose ports are TAP devices,
one per emulated host, each moved into that host's network namespace. Each host's link can be cut, delayed, made
lossy or narrowed; what crosses it is real Ethernet frames of the kernels' own TCP/IP, so a delay is a round trip,
a loss a retransmission, a narrow link a queue. (tc's netem and gact are not in every kernel, this one's included:
the wire does in user space what they would.) ``python -m runtime.netwire CONTROL NAME...`` creates the TAP devices
NAME..., prints ``ready`` and serves JSON lines on the Unix socket CONTROL: ``{"port": NAME, "cut": bool,
"delay_ms": float, "loss": float, "rate_bps": float or null}`` sets a link (answer ``{"ok": true}``), ``{"stats":
true}`` answers the frames forwarded and dropped per port. It exits on SIGTERM or when its stdin closes; the TAP
devices go with it."""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import random
import selectors
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
QUEUE_S = 0.5  # a narrowed link queues at most this long (then drops, as tc's tbf with latency 500ms)


@dataclass
class Link:
    """One host's link, both ways: cut, delayed, lossy, narrowed (None: unlimited)."""

    cut: bool = False
    delay_ms: float = 0.0
    loss: float = 0.0
    rate_bps: float | None = None
    free_at: dict[str, float] = field(default_factory=lambda: {"in": 0.0, "out": 0.0})  # the rate's queue, per way

    def passes(self, way: str, size: int, now: float, rng: random.Random) -> float | None:
        """When a frame of ``size`` bytes crossing this link ``way`` is out of it (None: dropped)."""
        if self.cut or (self.loss and rng.random() < self.loss):
            return None
        start = now
        if self.rate_bps:
            start = max(now, self.free_at[way])
            if start - now > QUEUE_S:
                return None
            self.free_at[way] = start + size * 8 / self.rate_bps
        return start + self.delay_ms / 1e3


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Wire:
    """A learning switch over TAP ports with a Link per port; frames in flight wait in one heap by due time."""

    def __init__(self, names: list[str]) -> None:
        self.fds = {name: open_tap(name) for name in names}
        self.links = {name: Link() for name in names}
        self.port_of: dict[bytes, str] = {}  # MAC -> port
        self.due: list[tuple[float, int, str, bytes]] = []
        self.seq = 0
        self.rng = random.Random(1)
        self.stats = {name: {"forwarded": 0, "dropped": 0} for name in names}

    def receive(self, src: str, now: float) -> None:
        try:
            frame = os.read(self.fds[src], 65536)
        except BlockingIOError:
            return
        self.port_of[frame[6:12]] = src
        dst = self.port_of.get(frame[0:6])
        for port in ([dst] if dst is not None and dst != src else [p for p in self.fds if p != src]):
            at = self.links[src].passes("out", len(frame), now, self.rng)
            at = None if at is None else self.links[port].passes("in", len(frame), at, self.rng)
            if at is None:
                self.stats[port]["dropped"] += 1
                continue
            self.seq += 1
            heapq.heappush(self.due, (at, self.seq, port, frame))

    def deliver(self, now: float) -> float | None:
        """Write every frame due by ``now``; the seconds until the next one (None: none waits)."""
        while self.due and self.due[0][0] <= now:
            _, _, port, frame = heapq.heappop(self.due)
            try:
                os.write(self.fds[port], frame)
                self.stats[port]["forwarded"] += 1
            except OSError:  # the port's device is down (its namespace went): as a cut cable
                self.stats[port]["dropped"] += 1
        return max(0.0, self.due[0][0] - now) if self.due else None

    def control(self, msg: dict) -> dict:
        if msg.get("stats"):
            return {"ok": True, "stats": self.stats}
        port = msg.get("port")
        if port not in self.links:
            return {"ok": False, "error": f"no port {port!r}"}
        rate = msg.get("rate_bps")
        self.links[port] = Link(bool(msg.get("cut", False)), float(msg.get("delay_ms", 0.0)),
                                float(msg.get("loss", 0.0)), float(rate) if rate else None)
        return {"ok": True}


def serve(control_path: str, names: list[str]) -> None:
    wire = Wire(names)
    sel = selectors.DefaultSelector()
    for name, fd in wire.fds.items():
        sel.register(fd, selectors.EVENT_READ, ("tap", name))
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ctl.bind(control_path)
    ctl.listen(8)
    sel.register(ctl, selectors.EVENT_READ, ("accept", None))
    sel.register(sys.stdin, selectors.EVENT_READ, ("stdin", None))
    print("ready", flush=True)
    wait: float | None = None
    while True:
        for key, _ in sel.select(wait):
            kind, name = key.data
            if kind == "tap":
                wire.receive(name, time.monotonic())
            elif kind == "accept":
                conn, _ = ctl.accept()
                sel.register(conn, selectors.EVENT_READ, ("conn", None))
            elif kind == "conn":
                _answer(sel, key.fileobj, wire)
            elif not sys.stdin.readline():  # the test bed that started it is gone
                return
        wait = wire.deliver(time.monotonic())


def _answer(sel: selectors.BaseSelector, conn, wire: Wire) -> None:
    """One JSON line in, one out; a closed or bad connection is dropped."""
    try:
        line = conn.makefile("r").readline()
        if not line:
            raise ConnectionError
        conn.sendall((json.dumps(wire.control(json.loads(line))) + "\n").encode())
    except (OSError, ValueError, ConnectionError):
        sel.unregister(conn)
        conn.close()


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(sys.argv[1], sys.argv[2:])
