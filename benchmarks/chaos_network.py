"""``benchmarks/chaos.py --network``: the emulated paper cluster with each host in a network namespace of its own
(runtime.netbed: the L4 host, the T4 host, and the sidecar with its clients), links shaped to the cluster file's
bandwidth (scaled as the emulated tensors are), served open loop at 0.7 of its sustainable rate while network
faults run on a host's link: cut (a partition) and healed, 100 ms of added delay each way, 5 % frame loss, the
link narrowed to a tenth. Printed: per fault window the requests, answers, explicit errors, hung requests (no answer
within SLO + 10 s) and the time to recover to >= 99 % attainment; the sidecar's view of each host (in service,
excluded, rejoined: its poolpipe_sidecar_vgpu_up gauge sampled, its vgpu_down/vgpu_up log lines); and that no
namespace, process or shm region is left. Every namespace the run makes is deleted, also when it fails."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from model_repository_gen.manifest import load_manifest
from runtime.netbed import LinkState, NetBed, unavailable
from runtime.sidecar_process import ROOT
from runtime.supervise import STATE_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks are scripts: a sibling imports as a module
import chaos  # noqa: E402
from chaos import Cluster  # noqa: E402
from chaos_report import Outcomes, Window, recovery_s, report, sample  # noqa: E402

NET_FAULTS = ("partition", "delay_100ms", "loss_5pct", "narrow_10x")
FAULT_HOST = {"partition": "t4", "delay_100ms": "t4", "loss_5pct": "t4", "narrow_10x": "l4"}
RECOVERY_BOUND_S = 10.0  # what the run holds each fault's recovery to (>= 99 % attainment again)
CLONE_NEWNET = 0x40000000


def enter_namespace(name: str) -> None:
    """Move this thread (the main one, before any client or sidecar starts) into namespace ``name``: the clients and
    the sidecar it starts live there, reaching the hosts over the wire only."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
    finally:
        os.close(fd)


def network_cluster_doc(doc: dict, bed: NetBed) -> dict:
    """The paper's cluster file with each host at its namespace's address (whose ports are all free: a fixed
    base_port, as a real remote host has)."""
    return {"hosts": [{**h, "address": bed.addresses[h["name"]], "base_port": 21000} for h in doc["hosts"]]}


class NetCluster(Cluster):
    """One ``poolpipe launch --host H`` per host, each in its namespace; the sidecar where this process is."""

    def __init__(self, deploy: Path, work: Path, bed: NetBed) -> None:  # noqa: D107 - no super(): launches differ
        self.deploy, self.work, self.bed = deploy, work, bed
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.hosts = sorted({v.host for v in load_manifest(deploy).vgpus})
        self.logs = {h: open(work / f"launch-{h}.log", "wb") for h in self.hosts}
        self.launches = {h: subprocess.Popen([*bed.exec_args(h), sys.executable, "-m", "poolpipe", "launch",
                                              str(deploy), "--host", h, "--no-hardware-check", "--max-restarts",
                                              "100"], env=env, stdout=self.logs[h], stderr=subprocess.STDOUT)
                         for h in self.hosts}
        self.launch = next(iter(self.launches.values()))  # the base class's reports read one pid
        self.sidecar = None
        self.sidecar_pids: list[int] = []
        self.server_pids: set[int] = set()

    def servers(self) -> dict[str, int]:
        pids: dict[str, int] = {}
        for p in self.launches.values():
            try:
                pids |= json.loads((STATE_DIR / f"{p.pid}.json").read_text())["servers"]
            except (OSError, ValueError, KeyError):
                continue
        self.server_pids |= set(pids.values())
        return pids

    def wait_servers(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        for h, p in self.launches.items():
            while "ready:" not in (self.work / f"launch-{h}.log").read_text(errors="replace"):
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"launch of {h} did not get ready: "
                                       f"{(self.work / f'launch-{h}.log').read_text()[-2000:]}")
                time.sleep(0.2)
        self.servers()

    def shm_regions(self) -> list[str]:
        prefixes = [f"{chaos.SIDECAR_SHM_PREFIX}{p}_" for p in self.sidecar_pids] + \
            [f"{chaos.SHM_PREFIX}{p.pid}_" for p in self.launches.values()]
        return sorted(p.name for p in Path("/dev/shm").iterdir() if any(p.name.startswith(x) for x in prefixes))

    def stop(self) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()
        for p in self.launches.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.launches.values():
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in self.logs.values():
            f.close()


def link_rate_bps(bandwidth_gbps: float, tensor_scale: float) -> float:
    """A host's link as the cluster file gives it, scaled as the emulated tensors are (the sidecar reserves the
    profiled bytes' time on it; the bytes that cross are the scaled ones)."""
    return bandwidth_gbps * 1e9 * tensor_scale


def fault_state(fault: str, base: LinkState) -> LinkState:
    if fault == "partition":
        return LinkState(cut=True, rate_bps=base.rate_bps)
    if fault == "delay_100ms":
        return LinkState(delay_ms=100.0, rate_bps=base.rate_bps)
    if fault == "loss_5pct":
        return LinkState(loss=0.05, rate_bps=base.rate_bps)
    if fault == "narrow_10x":
        return LinkState(rate_bps=(base.rate_bps or 1e9) / 10)
    raise ValueError(fault)


def run_network_faults(bed: NetBed, base: LinkState, schedule: list[tuple[float, str]], burst_s: float, t0: float,
                       windows: list[Window], stop: threading.Event) -> None:
    """Each fault on its host's link for ``burst_s``, then the link healed (the window ends at the heal)."""
    for at, fault in schedule:
        while time.monotonic() - t0 < at:
            if stop.wait(0.05):
                return
        host = FAULT_HOST[fault]
        w = Window(fault, time.monotonic() - t0)
        windows.append(w)
        try:
            bed.set_link(host, fault_state(fault, base))
            stop.wait(burst_s)
            note = f"{host} {burst_s:.0f} s"
        except Exception as e:  # noqa: BLE001 - a fault that could not be run is reported, the run goes on
            note = f"FAILED: {e}"
        finally:
            bed.set_link(host, base)
        w.end_s, w.note = time.monotonic() - t0, note
        print(f"  {w.start_s:7.1f} s  {fault:13s} window {w.end_s - w.start_s:5.1f} s  {note}", flush=True)


def sample_hosts(c: NetCluster, t0: float, views: list[tuple[float, dict[str, tuple[int, int]]]],
                 stop: threading.Event) -> None:
    """Every 0.25 s: per host, (vGPUs in service, vGPUs) from the sidecar's poolpipe_sidecar_vgpu_up gauge."""
    host_of = {v.id: v.host for v in load_manifest(c.deploy).vgpus}
    while not stop.wait(0.25):
        if c.sidecar is None:
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{c.sidecar.metrics_port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            continue
        per: dict[str, list[int]] = {}
        for vgpu, up in re.findall(r'^poolpipe_sidecar_vgpu_up\{vgpu="([^"]+)"\} (\S+)$', text, re.M):
            if vgpu in host_of:
                n = per.setdefault(host_of[vgpu], [0, 0])
                n[0] += float(up) == 1.0
                n[1] += 1
        views.append((time.monotonic() - t0, {h: (u, n) for h, (u, n) in per.items()}))


def host_view_lines(views: list, windows: list[Window], log_text: str) -> list[str]:
    """Per fault window: how the sidecar saw the faulted host (excluded at, back in service at), and its log's
    vgpu_down / vgpu_up lines over the run."""
    lines = []
    for w in windows:
        host = FAULT_HOST[w.fault]
        seen = [(t, v[host]) for t, v in views if host in v and w.start_s <= t <= w.end_s + 30.0]
        out = next((t for t, (u, n) in seen if u < n and t <= w.end_s + 5.0), None)
        back = next((t for t, (u, n) in seen if out is not None and t > out and u == n), None)
        lines.append(f"  {w.fault:13s} host {host}: "
                     + ("in service throughout" if out is None else
                        f"excluded {out - w.start_s:+.1f} s after the fault, "
                        + ("never rejoined" if back is None else f"rejoined {back - w.end_s:+.1f} s after the heal")))
    downs, ups = log_text.count("event=vgpu_down"), log_text.count("event=vgpu_up")
    lines.append(f"  sidecar log: {downs} vgpu_down, {ups} vgpu_up lines")
    return lines


def check_available() -> str | None:
    why = unavailable()
    return None if why is None else f"--network needs network namespaces: {why}"


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    import numpy as np

    from model_repository_gen.generate import generate
    from planner.entry import plan
    from planner.request import PlanRequest
    from poolpipe.paper_experiment import PaperExperiment, PaperRun, cluster_doc, paper_spec
    from workloads.arrivals import arrival_times

    ap = argparse.ArgumentParser(prog="chaos.py --network", description=__doc__)
    ap.add_argument("--network", action="store_true")
    ap.add_argument("--quick", action="store_true", help="3 minutes instead of 20")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--model", default=chaos.MODEL)
    ap.add_argument("--l4", type=int, default=2)
    ap.add_argument("--t4", type=int, default=6)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args(argv)
    why = check_available()
    if why:
        print(why)
        return 2
    minutes = args.minutes or (3.0 if args.quick else 20.0)
    duration = minutes * 60.0
    warmup, period, burst_s = (20.0, 30.0, 5.0) if minutes <= 5 else (60.0, 60.0, 10.0)
    bed = NetBed(("sc", "l4", "t4"))
    with tempfile.TemporaryDirectory(prefix="chaos_net_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        exp = PaperExperiment(PaperRun(args.model, l4=args.l4, t4=args.t4, time_scale=0.0), work)
        exp.run = run = dataclasses.replace(exp.run, time_scale=exp.auto_time_scale())
        spec = paper_spec(run)
        p = plan(spec, PlanRequest("ppipe", time_limit_s=60)).plan
        try:
            bed.start()
            (work / "cluster.json").write_text(json.dumps(network_cluster_doc(
                cluster_doc(run, p.cluster.bandwidth_gbps), bed)))
            manifest = generate(p, {}, work / "cluster.json", work / "deploy", emulated_tensor_scale=run.tensor_scale)
            base = LinkState(rate_bps=link_rate_bps(p.cluster.bandwidth_gbps, run.tensor_scale))
            for h in ("l4", "t4"):
                bed.set_link(h, base)
            rate = args.load * p.models[0].sustainable_rps
            slo_s = spec.models[0].slo_us / 1e6
            print(f"{args.model} on emulated {args.l4} L4 + {args.t4} T4 in network namespaces "
                  f"({len(manifest.vgpus)} tritonservers, time x{run.time_scale:g}, links "
                  f"{base.rate_bps / 1e6:.0f} Mbit/s = {p.cluster.bandwidth_gbps:g} Gbit/s x tensor scale "
                  f"{run.tensor_scale:g}): SLO {slo_s * 1e3:.0f} ms, {rate:.1f} req/s, {minutes:g} min, "
                  f"a network fault every {period:.0f} s after {warmup:.0f} s", flush=True)
            schedule = [(t, NET_FAULTS[i % len(NET_FAULTS)])
                        for i, t in enumerate(np.arange(warmup, duration - period / 2, period))]
            valid = sorted(float(t) for t in arrival_times("poisson", rate, duration, 1))
            return _serve(bed, base, work, manifest.models[0].name, valid, slo_s, schedule, burst_s, warmup,
                          duration)
        finally:
            left = bed.close()
            print(f"network namespaces left: {len(left)} {left or ''}")


def _serve(bed: NetBed, base: LinkState, work: Path, model: str, valid: list[float], slo_s: float,
           schedule: list, burst_s: float, warmup: float, duration: float) -> int:
    enter_namespace(bed.namespace("sc"))
    c = NetCluster(work / "deploy", work, bed)
    out, windows, samples, views = Outcomes(), [], {}, []
    shm = chaos.load_and_join(c, model, valid, [], slo_s, warmup, out,
                              [lambda t0, stop: run_network_faults(bed, base, schedule, burst_s, t0, windows, stop),
                               lambda t0, stop: sample(c, t0, samples, stop),
                               lambda t0, stop: sample_hosts(c, t0, views, stop)])
    passed = report(out, windows, samples, warmup, duration, shm)
    print("\nthe sidecar's view of the faulted host (its poolpipe_sidecar_vgpu_up gauge, sampled every 0.25 s):")
    print("\n".join(host_view_lines(views, windows, (work / "sidecar.log").read_text(errors="replace"))))
    recoveries = [recovery_s(out, w, windows) for w in windows]
    print("recovery to >= 99 % after each heal (s): " + ", ".join(f"{w.fault} {r:.2f}" for w, r in
                                                                    zip(windows, recoveries)))
    left = sorted(p for p in {*(lp.pid for lp in c.launches.values()), *c.sidecar_pids, *c.server_pids}
                  if chaos.pid_alive(p))
    leftover = c.shm_regions()
    print(f"after the run: {len(left)} poolpipe process(es) left {left or ''}, {len(leftover)} /dev/shm entr(y/ies) "
          f"left {leftover or ''}")
    # network faults are held to RECOVERY_BOUND_S, not chaos.report's 2 s for process faults
    passed = (out.result.count("hung") == 0 and out.result.count("pending") == 0 and not left and not leftover
              and all(r <= RECOVERY_BOUND_S for r in recoveries))
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
