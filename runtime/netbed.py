"""Hosts as network namespaces: a test bed in which each emulated host (and the sidecar with its clients) has a
kernel network stack of its own, joined by one wire (runtime.netwire) on which a host's link can be cut, delayed,
made lossy or narrowed. Processes run in a host with :meth:`NetBed.exec_args` (``ip netns exec``); every namespace
the bed makes is deleted when it closes, also after a failure, and its TAP devices go with the wire's process.

Only root can make namespaces: :func:`unavailable` says in one line why a bed cannot be made here (tests skip with
it). Addresses are on 10.231.0.0/24 inside the bed's namespaces only; nothing is added to the caller's own.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LinkState", "NetBed", "unavailable"]


def unavailable() -> str | None:
    """Why no bed can be made here (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "/dev/net/tun is missing"
    return None


@dataclass(frozen=True)
class LinkState:
    """A host's link: cut (a partition), an added one-way delay, a loss rate per frame, a rate (None: unlimited)."""

    cut: bool = False
    delay_ms: float = 0.0
    loss: float = 0.0
    rate_bps: float | None = None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


@dataclass
class NetBed:
    """Namespaces ``<tag>-<host>`` for ``hosts``, each with an address on one /24, joined by the wire."""

    hosts: tuple[str, ...]
    tag: str = field(default_factory=lambda: f"pp{os.getpid() % 100000}")
    mtu: int = 16000
    addresses: dict[str, str] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)  # namespaces made so far (deleted on close)
    wire: subprocess.Popen | None = None
    control: Path | None = None

    def __post_init__(self) -> None:  # the bed's own /24: it exists only inside the bed's namespaces
        self.addresses = {h: f"10.231.0.{i + 2}" for i, h in enumerate(self.hosts)}

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def exec_args(self, host: str) -> list[str]:
        """The command prefix that runs a program in ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def start(self) -> NetBed:
        why = unavailable()
        if why:
            raise RuntimeError(f"no network test bed here: {why}")
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.control = Path(tempfile.mkdtemp(prefix=f"{self.tag}-wire-")) / "control"
        taps = [f"{self.tag}t{i}" for i in range(len(self.hosts))]
        self.wire = subprocess.Popen([sys.executable, "-m", "runtime.netwire", str(self.control), *taps],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=Path(__file__).resolve().parents[1])
        assert self.wire.stdout is not None
        if self.wire.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the wire did not start (exit {self.wire.wait(10)})")
        for host, tap in zip(self.hosts, taps):
            ns = self.namespace(host)
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("link", "set", tap, "netns", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", tap, "mtu", str(self.mtu))
            _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", tap)
            _ip("-n", ns, "link", "set", tap, "up")

    def _ask(self, msg: dict) -> dict:
        assert self.control is not None, "the bed is not started"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(self.control))
            s.sendall((json.dumps(msg) + "\n").encode())
            answer = json.loads(s.makefile("r").readline())
        if not answer.get("ok"):
            raise ValueError(answer.get("error", answer))
        return answer

    def set_link(self, host: str, state: LinkState = LinkState()) -> None:
        """Set ``host``'s link (LinkState(): a healthy one)."""
        self._ask({"port": f"{self.tag}t{self.hosts.index(host)}", "cut": state.cut, "delay_ms": state.delay_ms,
                   "loss": state.loss, "rate_bps": state.rate_bps})

    def stats(self) -> dict[str, dict[str, int]]:
        """Frames forwarded to and dropped on the way to each host."""
        raw = self._ask({"stats": True})["stats"]
        return {h: raw[f"{self.tag}t{i}"] for i, h in enumerate(self.hosts)}

    def close(self) -> list[str]:
        """Stop the wire and delete every namespace made; returns the bed's namespaces still there (none)."""
        if self.wire is not None and self.wire.poll() is None:
            self.wire.terminate()
            try:
                self.wire.wait(10)
            except subprocess.TimeoutExpired:
                self.wire.kill()
                self.wire.wait()
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self.control is not None:
            shutil.rmtree(self.control.parent, ignore_errors=True)
        self.made = []
        return self.left()

    def left(self) -> list[str]:
        """This bed's namespaces that exist now."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(f"{self.tag}-")]

    def __enter__(self) -> NetBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for(cond, timeout_s: float, what: str) -> None:
    """Poll ``cond`` until it holds (RuntimeError naming ``what`` after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.05)
