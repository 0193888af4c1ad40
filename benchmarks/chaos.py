"""Hours of service under faults: an emulated paper cluster (PPipe's measured profiles on L4 + T4, real
tritonservers that hold each batch for its profiled latency) served by `poolpipe launch` and `poolpipe serve` at
0.7 of the rate its plan sustains at >= 99 % (plan.json's sustainable_rps), open loop, while a schedule of faults runs:
a Triton server SIGKILLed (launch restarts it, the sidecar rejoins it), the sidecar SIGKILLed and restarted on its
ports, a reload (SIGHUP), a 3x overload burst, and a client cancellation storm. Printed: per fault window the
requests, answers, explicit errors, hung requests (no answer within the SLO + 10 s: none allowed) and the time to
recover to >= 99 % attainment; attainment outside the fault windows; RSS, open fds and threads of every poolpipe
process and the shm regions at start (after warm-up) and end; and whether any process or /dev/shm entry is left
after the run. ``--network``: hosts in network namespaces, faults on their links (benchmarks/chaos_network.py).

    python -P benchmarks/chaos.py [--quick] [--network]   # 20 minutes, real time (--quick: 3)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from model_repository_gen.manifest import load_manifest
from planner.entry import plan
from planner.request import PlanRequest
from poolpipe.paper_experiment import PaperExperiment, PaperRun, paper_spec
from runtime.sidecar_process import PORTS, ROOT, SidecarProcess
from runtime.supervise import STATE_DIR, pid_alive
from runtime.tritonserver import SHM_PREFIX
from scheduler.server.planned.shm_pool import PREFIX as SIDECAR_SHM_PREFIX
from workloads.arrivals import arrival_times

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks are scripts: a sibling imports as a module
from chaos_report import Outcomes, Window, report, sample  # noqa: E402

MODEL = "centernet-update_r50-caffe_fpn_ms-1x_coco"
FAULTS = ("server_kill", "sidecar_kill", "reload", "overload_3x", "cancel_storm")
# A client as a production one is configured: reconnect within 250 ms of a restarted sidecar.
CHANNEL_ARGS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 250)]


class Cluster:
    """`poolpipe launch` of the deployment and one sidecar (restarted on the same ports), each by pid."""

    def __init__(self, deploy: Path, work: Path) -> None:
        self.deploy, self.work = deploy, work
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.launch_log = open(work / "launch.log", "wb")
        self.launch = subprocess.Popen([sys.executable, "-m", "poolpipe", "launch", str(deploy),
                                        "--no-hardware-check", "--max-restarts", "100"], env=env,
                                       stdout=self.launch_log, stderr=subprocess.STDOUT)
        self.sidecar: SidecarProcess | None = None
        self.sidecar_pids: list[int] = []
        self.server_pids: set[int] = set()

    def servers(self) -> dict[str, int]:
        try:
            pids = json.loads((STATE_DIR / f"{self.launch.pid}.json").read_text())["servers"]
        except (OSError, ValueError, KeyError):
            return {}
        self.server_pids |= set(pids.values())
        return pids

    def wait_servers(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "ready:" not in (self.work / "launch.log").read_text(errors="replace"):
            if self.launch.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"launch did not get ready: {(self.work / 'launch.log').read_text()[-2000:]}")
            time.sleep(0.2)
        self.servers()

    def start_sidecar(self) -> float:
        """A sidecar on the first one's ports; returns seconds from its start to ready."""
        old = self.sidecar
        ports = {} if old is None else {k: getattr(old, k) for k in PORTS}
        t0 = time.monotonic()
        self.sidecar = SidecarProcess(manifest=self.deploy, log_path=self.work / "sidecar.log", **ports,
                                      extra_args=("--batch-log", str(self.work / "batches.jsonl"))).start()
        assert self.sidecar.proc is not None
        self.sidecar_pids.append(self.sidecar.proc.pid)
        self.sidecar.wait_ready()
        return time.monotonic() - t0

    def shm_regions(self) -> list[str]:
        prefixes = [f"{SIDECAR_SHM_PREFIX}{p}_" for p in self.sidecar_pids] + [f"{SHM_PREFIX}{self.launch.pid}_"]
        return sorted(p.name for p in Path("/dev/shm").iterdir() if any(p.name.startswith(x) for x in prefixes))

    def stop(self) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()
        if self.launch.poll() is None:
            self.launch.send_signal(signal.SIGTERM)
            try:
                self.launch.wait(120)
            except subprocess.TimeoutExpired:
                self.launch.kill()
                self.launch.wait()
        self.launch_log.close()


# -- faults --------------------------------------------------------------------------------------------------
def server_ready(url: str) -> bool:
    try:
        return grpcclient.InferenceServerClient(url).is_server_ready(client_timeout=1)
    except InferenceServerException:
        return False


def kill_server(c: Cluster, rng: random.Random) -> str:
    vgpu, pid = rng.choice(sorted(c.servers().items()))
    url = next(g.grpc_url for g in load_manifest(c.deploy).vgpus if g.id == vgpu)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while c.servers().get(vgpu) == pid or not server_ready(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"launch did not restart vGPU {vgpu}")
        time.sleep(0.05)
    return f"vGPU {vgpu}"


def kill_sidecar(c: Cluster, _rng: random.Random) -> str:
    c.sidecar.proc.kill()
    c.sidecar.proc.wait()
    return f"ready {c.start_sidecar():.1f} s after restart"


def reload(c: Cluster, _rng: random.Random) -> str:
    log = c.work / "sidecar.log"
    before = log.read_text(errors="replace").count("event=reloaded")
    c.sidecar.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 90
    while log.read_text(errors="replace").count("event=reloaded") <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("the sidecar did not reload")
        time.sleep(0.05)
    return next((w for w in reversed(log.read_text(errors="replace").split()) if w.startswith("pause_ms=")), "")


def run_faults(c: Cluster, schedule: list[tuple[float, str]], burst_s: float, t0: float,
               windows: list[Window], stop: threading.Event) -> None:
    """Run each fault at its time (s from t0) and record its window; overload and storms are in the arrivals."""
    rng = random.Random(7)
    actions = {"server_kill": kill_server, "sidecar_kill": kill_sidecar, "reload": reload}
    for at, fault in schedule:
        while time.monotonic() - t0 < at:
            if stop.wait(0.05):
                return
        w = Window(fault, time.monotonic() - t0)
        windows.append(w)
        try:
            if fault in actions:
                note = actions[fault](c, rng)
            else:  # the burst's or storm's requests are in the arrivals
                time.sleep(burst_s)
                note = f"{burst_s:.0f} s"
        except Exception as e:  # noqa: BLE001 - a fault that could not be run is reported, the run goes on
            note = f"FAILED: {e}"
        w.end_s, w.note = time.monotonic() - t0, note
        print(f"  {w.start_s:7.1f} s  {fault:13s} window {w.end_s - w.start_s:5.1f} s  {note}", flush=True)


# -- load ----------------------------------------------------------------------------------------------------
async def run_load(url: str, model: str, valid: list[float], storm: list[float], slo_s: float,
                   t0: float, out: Outcomes) -> None:
    """Open loop: each valid request at its time, recorded; each storm request cancelled 2-20 ms after sending."""
    client = grpcaio.InferenceServerClient(url, channel_args=CHANNEL_ARGS)
    meta = await client.get_model_metadata(model)
    shape = [1, *[max(1, int(d)) for d in list(meta.inputs[0].shape)[1:]]]
    inp = InferInput(meta.inputs[0].name, shape, meta.inputs[0].datatype)
    inp.set_data_from_numpy(np.zeros(shape, np.float32))
    rng = np.random.default_rng(3)

    async def one(i: int) -> None:
        start = time.monotonic()
        try:
            await asyncio.wait_for(client.infer(model, [inp]), slo_s + 10.0)
            out.result[i] = "met" if time.monotonic() - start <= slo_s else "late"
        except InferenceServerException as e:
            out.result[i] = "error"
            out.reasons[(e.message() or str(e))[:150]] += 1
        except asyncio.TimeoutError:
            out.result[i] = "hung"

    async def cancelled(after_s: float) -> None:
        task = asyncio.ensure_future(client.infer(model, [inp]))
        await asyncio.sleep(after_s)
        out.storm_cancelled += not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    events = sorted([(t, 0) for t in valid] + [(t, 1) for t in storm])
    tasks = []
    for t, kind in events:
        await asyncio.sleep(max(0.0, t0 + t - time.monotonic()))
        if kind == 0:
            out.sent_s.append(time.monotonic() - t0)
            out.result.append("pending")
            tasks.append(asyncio.ensure_future(one(len(out.result) - 1)))
        else:
            out.storm_sent += 1
            tasks.append(asyncio.ensure_future(cancelled(float(rng.uniform(0.002, 0.02)))))
    await asyncio.gather(*tasks)
    await client.close()


def load_and_join(c: Cluster, model: str, valid: list[float], storm: list[float], slo_s: float, warmup_s: float,
                  out: Outcomes, watchers: list[Callable[[float, threading.Event], None]]) -> tuple[int, int]:
    """Both chaos runs: servers up, the sidecar started, ``watchers`` (faults, samplers: called with the start time
    and the stop event) in threads beside the load into ``out``, all joined and the cluster stopped, also on a failure.
    Returns the cluster's shm regions a second before the warm-up ends (-1: not counted) and after the load."""
    stop = threading.Event()
    shm_start: list[int] = []
    try:
        c.wait_servers()
        c.start_sidecar()
        t0 = time.monotonic() + 1.0
        threads = [threading.Thread(target=w, args=(t0, stop), daemon=True) for w in watchers]
        for th in threads:
            th.start()
        threading.Timer(warmup_s - 1.0, lambda: shm_start.append(len(c.shm_regions()))).start()
        asyncio.run(run_load(c.sidecar.grpc_url, model, valid, storm, slo_s, t0, out))
        shm_end = len(c.shm_regions())
        stop.set()
        for th in threads:
            th.join(150)
    finally:
        stop.set()
        c.stop()
    return (shm_start[0] if shm_start else -1), shm_end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 minutes instead of 20")
    ap.add_argument("--minutes", type=float, help="length of the run (default 20; --quick 3)")
    ap.add_argument("--load", type=float, default=0.7,
                    help="share of the rate the plan sustains at >= 99 %% SLO attainment (its sustainable_rps) "
                         "offered (default %(default)s)")
    ap.add_argument("--model", default=MODEL, help="a data/ppipe model (default: %(default)s)")
    ap.add_argument("--l4", type=int, default=2)
    ap.add_argument("--t4", type=int, default=6)
    ap.add_argument("--time-scale", type=float, default=1.0,
                    help="emulated latencies and the SLO multiplied by this (default 1: real time; 0: the demo's slow "
                         "motion, the smallest whole scale >= 8 at which this machine drives the plan calmly)")
    ap.add_argument("--work", type=Path, help="keep deployment and logs here (default: a temporary directory)")
    ap.add_argument("--network", action="store_true", help="hosts in network namespaces, faults on their links")
    if (args := ap.parse_args()).network:  # the same cluster and load, each host in a network namespace of its own
        os.execl(sys.executable, sys.executable, "-P", str(Path(__file__).with_name("chaos_network.py")), *sys.argv[1:])
    minutes = args.minutes or (3.0 if args.quick else 20.0)
    duration = minutes * 60.0
    warmup, period, burst_s = (20.0, 30.0, 5.0) if minutes <= 5 else (60.0, 60.0, 10.0)
    if args.time_scale < 0:
        ap.error("--time-scale must be >= 0 (1: real time, 0: the demo's slow motion)")
    with tempfile.TemporaryDirectory(prefix="chaos_") as tmp:
        work = args.work or Path(tmp)
        exp = PaperExperiment(PaperRun(args.model, l4=args.l4, t4=args.t4, time_scale=0.0), work)
        exp.run = run = replace(exp.run, time_scale=args.time_scale or exp.auto_time_scale())
        spec = paper_spec(run)
        p = plan(spec, PlanRequest("ppipe", time_limit_s=60)).plan
        manifest = exp.deploy(p, "deploy")
        rate = args.load * p.models[0].sustainable_rps
        slo_s = spec.models[0].slo_us / 1e6
        print(f"{args.model} on emulated {args.l4} L4 + {args.t4} T4 ({len(manifest.vgpus)} tritonservers, time x"
              f"{run.time_scale:g}): SLO {slo_s * 1e3:.0f} ms, {rate:.1f} req/s ({args.load:g} of the "
              f"{p.models[0].sustainable_rps:.1f} its plan sustains; nominal {p.models[0].throughput_rps:.1f}), "
              f"{minutes:g} min, faults every {period:.0f} s after {warmup:.0f} s")
        schedule = [(t, FAULTS[i % len(FAULTS)]) for i, t in enumerate(np.arange(warmup, duration - period / 2,
                                                                                  period))]
        valid = list(arrival_times("poisson", rate, duration, 1))
        storm: list[float] = []
        for k, (at, fault) in enumerate(schedule):
            extra = arrival_times("poisson", 2 * rate if fault == "overload_3x" else rate, burst_s, 10 + k)
            if fault == "overload_3x":
                valid += [at + float(t) for t in extra]
            elif fault == "cancel_storm":
                storm += [at + float(t) for t in extra]
        valid.sort()
        c = Cluster(work / "deploy", work)
        out, windows, samples = Outcomes(), [], {}
        shm = load_and_join(c, manifest.models[0].name, valid, storm, slo_s, warmup, out,
                            [lambda t0, stop: run_faults(c, schedule, burst_s, t0, windows, stop),
                             lambda t0, stop: sample(c, t0, samples, stop)])
        passed = report(out, windows, samples, warmup, duration, shm)
        left = sorted(p for p in {c.launch.pid, *c.sidecar_pids, *c.server_pids} if pid_alive(p))
        leftover = c.shm_regions()
        print(f"after the run: {len(left)} poolpipe process(es) left {left or ''}, {len(leftover)} /dev/shm "
              f"entr(y/ies) left {leftover or ''}")
        passed = passed and not left and not leftover
        print("PASS" if passed else "FAIL")
        return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
