"""The network test bed (runtime.netbed): hosts in network namespaces joined by the wire, whose links carry real
TCP: a delay shows in the round trip, a loss as retransmissions, a narrowed link in the time a transfer takes, a
cut as a connection that fails until the link heals; closing the bed leaves no namespace and no device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.netbed import LinkState, NetBed, unavailable

WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no network test bed: {WHY}")

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5000)); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    with c:
        while (data := c.recv(65536)):
            c.sendall(b"!" * data.count(b"?"))  # one answer byte per question byte, however TCP cut the stream
"""
CLIENT = """
import json, socket, sys, time
addr, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    c = socket.create_connection((addr, 5000), timeout=8)  # SYN retried at 1, 3 and 7 s
except OSError as e:
    print(json.dumps({"error": str(e)})); sys.exit()
c.settimeout(60)
rtts = []
for _ in range(n):
    t = time.monotonic(); c.sendall(b"?"); c.recv(1); rtts.append(time.monotonic() - t)
c.settimeout(60)
t = time.monotonic(); c.sendall(b"x" * size + b"?"); c.recv(1)
print(json.dumps({"rtt_s": min(rtts), "transfer_s": time.monotonic() - t}))
"""


def _client(bed: NetBed, n: int = 5, size: int = 1) -> dict:
    r = subprocess.run([*bed.exec_args("a"), sys.executable, "-c", CLIENT, bed.addresses["b"], str(n), str(size)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _retransmitted(bed: NetBed) -> int:
    snmp = subprocess.run([*bed.exec_args("a"), "cat", "/proc/net/snmp"], capture_output=True, text=True).stdout
    head, values = [ln.split() for ln in snmp.splitlines() if ln.startswith("Tcp:")][:2]
    return int(values[head.index("RetransSegs")])


def test_a_link_delays_loses_narrows_and_cuts_real_tcp() -> None:
    bed = NetBed(("a", "b"))
    server = None
    try:
        bed.start()
        server = subprocess.Popen([*bed.exec_args("b"), sys.executable, "-c", SERVER, bed.addresses["b"]],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        healthy = _client(bed)
        bed.set_link("b", LinkState(delay_ms=100))
        delayed = _client(bed)
        assert delayed["rtt_s"] >= 0.2 > healthy["rtt_s"], (healthy, delayed)  # 100 ms each way
        bed.set_link("b", LinkState(loss=0.05))
        before = _retransmitted(bed)
        lossy = _client(bed, n=20, size=2_000_000)  # TCP delivers it all, retransmitting what the link lost
        assert "transfer_s" in lossy and _retransmitted(bed) > before and bed.stats()["b"]["dropped"] > 0
        bed.set_link("b", LinkState(rate_bps=8e6))
        narrow = _client(bed, size=2_000_000)
        assert narrow["transfer_s"] >= 0.9 * 2_000_000 * 8 / 8e6, narrow  # 2 MB at 8 Mbit/s: at least 2 s
        bed.set_link("b", LinkState(cut=True))
        assert "error" in _client(bed)
        bed.set_link("b")
        assert "rtt_s" in _client(bed)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        left = bed.close()
    assert left == [] and bed.wire is not None and bed.wire.poll() is not None
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{bed.tag}t" not in links
