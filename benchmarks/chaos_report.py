"""What benchmarks/chaos.py (and chaos_network.py) record and judge: each valid request's outcome, each fault's
window, the processes' RSS, fds and threads sampled while it runs, and the report: per fault window the requests,
answers, errors, hung ones and the recovery to >= 99 % attainment; attainment outside the windows; resource growth."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

TARGET = 0.99


@dataclass
class Window:
    fault: str
    start_s: float
    end_s: float = float("nan")
    note: str = ""


@dataclass
class Outcomes:
    """Per valid request: when it was sent (s from the start) and how it ended (met, late, error, hung)."""

    sent_s: list[float] = field(default_factory=list)
    result: list[str] = field(default_factory=list)
    storm_sent: int = 0
    storm_cancelled: int = 0
    reasons: Counter = field(default_factory=Counter)  # explicit errors by message


# -- process statistics ----------------------------------------------------------------------------------------
def proc_stats(pid: int) -> tuple[int, int, int] | None:
    """(RSS KiB, open fds, threads) of ``pid``, or None when it is gone."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return p.memory_info().rss // 1024, p.num_fds(), p.num_threads()
    except psutil.Error:
        return None


def sample(c: Any, t0: float, samples: dict[int, tuple[str, list]], stop: threading.Event) -> None:
    """Every 2 s: (time, stats) of the sidecar, launch and each server of ``c`` (a chaos Cluster), by pid."""
    while not stop.wait(2.0):
        roles = {c.launch.pid: "launch"}
        if c.sidecar is not None and c.sidecar.proc is not None:
            roles[c.sidecar.proc.pid] = "sidecar"
        roles |= {pid: f"server {v}" for v, pid in c.servers().items()}
        for pid, role in roles.items():
            s = proc_stats(pid)
            if s is not None:
                samples.setdefault(pid, (role, []))[1].append((time.monotonic() - t0, s))


# -- report ----------------------------------------------------------------------------------------------------
def attainment(out: Outcomes, lo: float, hi: float, skip: list[Window] = ()) -> tuple[int, float]:
    idx = [i for i, t in enumerate(out.sent_s) if lo <= t < hi and not any(w.start_s <= t < w.end_s for w in skip)]
    return len(idx), (sum(out.result[i] == "met" for i in idx) / len(idx) if idx else 1.0)


def recovery_s(out: Outcomes, w: Window, windows: list[Window], span_s: float = 3.0) -> float:
    """Seconds after the window until requests sent over the next ``span_s`` meet >= 99 % (inf: never)."""
    for r in np.arange(0.0, 30.0, 0.25):
        n, a = attainment(out, w.end_s + r, w.end_s + r + span_s, [x for x in windows if x is not w])
        if n and a >= TARGET:
            return float(r)
    return float("inf")


def report(out: Outcomes, windows: list[Window], samples: dict, warmup_s: float, end_s: float, shm: tuple) -> bool:
    ok = []
    print("\nfault windows (valid requests sent in the window):")
    print(f"  {'fault':13s} {'at s':>7s} {'len s':>6s} {'requests':>8s} {'answered':>8s} {'errors':>6s} "
          f"{'hung':>4s} {'met %':>6s} {'recovery s':>10s}")
    for w in windows:
        idx = [i for i, t in enumerate(out.sent_s) if w.start_s <= t < w.end_s]
        res = [out.result[i] for i in idx]
        rec = recovery_s(out, w, windows)
        ok.append(rec <= 2.0 and not w.note.startswith("FAILED"))
        print(f"  {w.fault:13s} {w.start_s:7.1f} {w.end_s - w.start_s:6.1f} {len(res):8d} "
              f"{sum(r in ('met', 'late') for r in res):8d} {res.count('error'):6d} {res.count('hung'):4d} "
              f"{100 * (res.count('met') / len(res) if res else 1):6.1f} {rec:10.2f}")
    excluded = [Window(w.fault, w.start_s, w.end_s + 2.0) for w in windows]
    n, a = attainment(out, warmup_s, end_s, excluded)
    hung, pending = out.result.count("hung"), out.result.count("pending")
    print(f"\nall: {len(out.result)} valid requests, {sum(r in ('met', 'late') for r in out.result)} answered, "
          f"{out.result.count('error')} explicit errors, {hung} hung, {pending} unanswered; cancellation storms: "
          f"{out.storm_sent} sent, {out.storm_cancelled} cancelled before their answer")
    print(f"outside fault windows (+2 s each), after warm-up: {n} requests, attainment {100 * a:.2f} %")
    bins = [attainment(out, t, t + 10.0)[1] for t in np.arange(0.0, end_s, 10.0)]
    print("met % per 10 s: " + " ".join(f"{100 * b:.0f}" for b in bins))
    for reason, k in out.reasons.most_common(4):
        print(f"  {k:5d} x {reason}")
    print("\nprocesses (RSS MiB, open fds, threads: first sample after warm-up -> last):")
    for pid, (role, ss) in sorted(samples.items(), key=lambda kv: kv[1][0]):
        first = next((s for t, s in ss if t >= max(warmup_s, ss[0][0] + 10.0)), ss[0][1])
        last = ss[-1][1]
        growth = (last[0] - first[0]) / first[0] if first[0] else 0.0
        if ss[-1][0] >= end_s - 5.0 and ss[-1][0] - ss[0][0] >= 20.0:  # alive at the end, long enough to judge
            ok.append(growth < 0.05 and last[1] <= first[1] + 2 and last[2] <= first[2] + 2)
        alive = "" if ss[-1][0] >= end_s - 5.0 else f" (gone at {ss[-1][0]:.0f} s: killed)"
        print(f"  {role:28s} pid {pid:7d}  rss {first[0] / 1024:7.1f} -> {last[0] / 1024:7.1f} ({100 * growth:+5.1f} %)"
              f"  fds {first[1]:4d} -> {last[1]:4d}  threads {first[2]:3d} -> {last[2]:3d}{alive}")
    print(f"shm regions: {shm[0]} after warm-up, {shm[1]} at the end")
    ok += [hung == 0, pending == 0, a >= TARGET, shm[1] <= shm[0]]
    return all(ok)
