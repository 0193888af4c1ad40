"""Fuzz a live sidecar with malformed KServe v2 requests over gRPC and HTTP, and print what it did with them.

By default it starts its own deployment (two emulated Triton servers on loopback and the sidecar; see
runtime/testbed.py), sends ``--requests`` requests, stops everything and prints: malformed requests answered with
an error, accepted (answered with outputs, or queued and shed), hung, unhandled (HTTP 500 / gRPC UNKNOWN), client
cancellations, whether valid requests mixed in still succeed (a shed, the scheduler's explicit answer on a busy
machine, is counted apart), sidecar crashes, and the sidecar's RSS after warm-up and at the end. Exit status 1 when a
target is missed (0 hung, 0 crashes, 0 unhandled, 0 accepted malformed, every valid request answered with outputs
or an explicit shed, RSS flat).

    python benchmarks/fuzz.py [--requests 10000] [--seed 0] [--concurrency 8]
    python benchmarks/fuzz.py --grpc-url 127.0.0.1:8001 --http-url 127.0.0.1:8000 --model NAME --pid PID
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.fuzz_cases import GrpcCase, RandomChooser, Target, grpc_case, http_case, valid_grpc, valid_http
from loadtest.fuzz_client import Outcome, cancel_grpc, cancel_http, fuzz_target, send_grpc, send_http
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment

RSS_FLAT_MIB = 20.0  # growth from warm-up to the end that still counts as flat


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Tally:
    def __init__(self) -> None:
        self.malformed: Counter[str] = Counter()
        self.by_proto: Counter[str] = Counter()
        self.valid: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, role: str, proto: str, kind: str, o: Outcome) -> None:
        box = {"malformed": self.malformed, "valid": self.valid, "cancel": self.cancelled}[role]
        box[o.result] += 1
        if role == "malformed":
            self.by_proto[proto] += 1
        bad = (role == "malformed" and o.result != "error") or (role == "valid" and o.result != "accepted") \
            or o.result in ("hung", "unhandled")
        if bad:
            self.examples.setdefault(f"{role}/{proto}/{kind}/{o.result}", o.detail[:160])


async def _one(i: int, ch: grpc.aio.Channel, session: aiohttp.ClientSession, http_base: str, t: Target,
               chooser: RandomChooser, timeout_s: float, tally: Tally) -> None:
    proto = "grpc" if i % 2 == 0 else "http"
    if i % 50 in (0, 1):
        o = await (send_grpc(ch, GrpcCase("valid", valid_grpc(t, chooser.number(1, t.max_batch))), timeout_s)
                   if proto == "grpc"
                   else send_http(session, http_base, valid_http(t, chooser.number(1, t.max_batch)), timeout_s))
        tally.add("valid", proto, "valid", o)
    elif i % 50 in (24, 25):
        after = chooser.number(0, 20) / 1000
        o = await (cancel_grpc(ch, valid_grpc(t, chooser.number(1, t.max_batch)), after) if proto == "grpc"
                   else cancel_http(session, http_base, valid_http(t, 1), max(after, 0.001)))
        tally.add("cancel", proto, "cancel", o)
    elif proto == "grpc":
        case = grpc_case(chooser, t)
        tally.add("malformed", proto, case.kind, await send_grpc(ch, case, timeout_s))
    else:
        hcase = http_case(chooser, t)
        tally.add("malformed", proto, hcase.kind, await send_http(session, http_base, hcase, timeout_s))


async def fuzz(grpc_url: str, http_url: str, model: str, n: int, seed: int, concurrency: int, timeout_s: float,
               pid: int | None) -> tuple[Tally, float, float, float]:
    """Returns the tally, RSS after warm-up and at the end (MiB), and the seconds it took."""
    chooser = RandomChooser(seed)
    tally = Tally()
    rss = [float("nan"), float("nan")]
    t0 = time.monotonic()
    async with grpc.aio.insecure_channel(grpc_url) as ch, aiohttp.ClientSession() as session:
        async with fuzz_target(ch, model, str(seed)) as t:
            sem = asyncio.Semaphore(concurrency)

            async def guarded(i: int) -> None:
                async with sem:
                    await _one(i, ch, session, f"http://{http_url}", t, chooser, timeout_s, tally)

            warm = max(n // 5, 1)
            await asyncio.gather(*(guarded(i) for i in range(warm)))
            rss[0] = rss_mib(pid) if pid else float("nan")
            await asyncio.gather(*(guarded(i) for i in range(warm, n)))
            rss[1] = rss_mib(pid) if pid else float("nan")
    return tally, rss[0], rss[1], time.monotonic() - t0


async def wait_ready(grpc_url: str, model: str, timeout_s: float = 90.0) -> None:
    async with grpc.aio.insecure_channel(grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if (await stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=2)).ready:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"model {model} not ready at {grpc_url} after {timeout_s:.0f} s")


def report(tally: Tally, rss0: float, rss1: float, seconds: float, crashed: bool, n: int) -> bool:
    m, v, c = tally.malformed, tally.valid, tally.cancelled
    grown = rss1 - rss0
    flat = not grown > RSS_FLAT_MIB  # NaN (no pid) counts as not measured, not as growth
    print(f"fuzz: {n} requests in {seconds:.1f} s ({n / seconds:.0f}/s), gRPC and HTTP")
    print(f"malformed sent            {sum(m.values())} (gRPC {tally.by_proto['grpc']}, HTTP {tally.by_proto['http']})")
    print(f"  answered with an error  {m['error']}")
    print(f"  accepted                {m['accepted'] + m['shed']}")
    print(f"  hung                    {m['hung'] + v['hung'] + c['hung']}")
    print(f"  unhandled (500/UNKNOWN) {m['unhandled'] + v['unhandled'] + c['unhandled']}")
    print(f"cancelled by the client   {c['cancelled']} (answered before the cancel: {c['accepted'] + c['error']})")
    print(f"valid requests            {v['accepted']}/{sum(v.values())} succeeded, {v['shed']} shed to protect the "
          f"SLO, {v['error']} failed")
    print(f"sidecar crashes           {int(crashed)}")
    print(f"sidecar RSS               {rss0:.1f} MiB after warm-up, {rss1:.1f} MiB at the end "
          f"({grown:+.1f} MiB): {'flat' if flat else 'GROWING'}")
    for key, detail in sorted(tally.examples.items())[:20]:
        print(f"  e.g. {key}: {detail}")
    return (m["accepted"] + m["shed"] == 0 and m["hung"] + v["hung"] + c["hung"] == 0 and not crashed and flat
            and m["unhandled"] + v["unhandled"] + c["unhandled"] == 0 and v["accepted"] + v["shed"] == sum(v.values()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=15.0, help="an answer later than this counts as hung")
    ap.add_argument("--grpc-url", help="fuzz this sidecar instead of starting one (with --http-url, --model)")
    ap.add_argument("--http-url")
    ap.add_argument("--model", default=EMULATED_MODEL)
    ap.add_argument("--pid", type=int, help="the sidecar's process id, for its RSS (with --grpc-url)")
    a = ap.parse_args()
    if a.grpc_url:
        tally, r0, r1, s = asyncio.run(fuzz(a.grpc_url, a.http_url, a.model, a.requests, a.seed, a.concurrency,
                                            a.timeout_s, a.pid))
        return 0 if report(tally, r0, r1, s, False, a.requests) else 1
    with tempfile.TemporaryDirectory(prefix="poolpipe-fuzz-") as tmp:
        deploy = build_emulated_deployment(Path(tmp))
        with Deployment(deploy, check_hardware=False, log_dir=Path(tmp) / "logs"):
            sc = SidecarProcess(manifest=deploy, log_path=Path(tmp) / "sidecar.log").start()
            try:
                asyncio.run(wait_ready(sc.grpc_url, a.model))
                tally, r0, r1, s = asyncio.run(fuzz(sc.grpc_url, sc.http_url, a.model, a.requests, a.seed,
                                                    a.concurrency, a.timeout_s, sc.proc.pid))
                crashed = sc.proc.poll() is not None
            finally:
                status = sc.stop()
    ok = report(tally, r0, r1, s, crashed or status not in (0, None), a.requests)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
