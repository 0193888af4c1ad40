"""PNG plots of a simulation (matplotlib, Agg): attainment vs load factor, and a Gantt timeline of batches."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from scheduler.sim.engine import SimResult  # noqa: E402
from scheduler.sim.sweep import TARGET_ATTAINMENT  # noqa: E402


def _natural(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"(\d+)", v))


def _short(name: str) -> str:
    return name.split("_")[0].split("-")[0] if len(name) > 16 else name


def plot_attainment(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for m in result["models"]:
        xs = [p["load_factor"] for p in m["points"]]
        ys = [100 * p["slo_attainment"] for p in m["points"]]
        line, = ax.plot(xs, ys, marker="o", ms=3.5, label=f"{_short(m['name'])} (max {m['max_load_factor']:.2f})")
        if m["max_load_factor"] > 0:
            ax.axvline(m["max_load_factor"], color=line.get_color(), ls=":", lw=1)
    ax.axhline(100 * TARGET_ATTAINMENT, color="grey", ls="--", lw=1, label=f"{100 * TARGET_ATTAINMENT:.0f}% SLO")
    ax.set_xlabel("load factor (1.0 = reference plan's throughput)")
    ax.set_ylabel("SLO attainment (%)")
    lo = min(100 * p["slo_attainment"] for m in result["models"] for p in m["points"])
    ax.set_ylim(max(0.0, min(lo, 95.0) - 2), 100.5)
    ax.set_title(f"{result['planner']} plan, policy {result['policy']}, trace {result['trace']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_gantt(sim: SimResult, path: Path, window_us: float = 150_000.0, max_rows: int = 28,
               title: str = "") -> None:
    """Batches per vGPU over a short window mid-run, with every stage of one dispatch highlighted."""
    tl = sim.timeline
    if not tl:
        return
    mid = sim.duration_us / 2
    lo, hi = mid, mid + window_us
    inside = [b for b in tl if b.end_us > lo and b.start_us < hi]
    # the highlighted path: a multi-stage dispatch that starts early in the window
    stages_of: dict[int, list] = {}
    for b in inside:
        stages_of.setdefault(b.dispatch_id, []).append(b)
    multi = [d for d, bs in stages_of.items() if len({x.stage for x in bs}) >= 2 and min(x.start_us for x in bs) > lo]
    focus = min(multi, key=lambda d: min(x.start_us for x in stages_of[d])) if multi else \
        (min(stages_of, key=lambda d: min(x.start_us for x in stages_of[d])) if stages_of else None)
    focus_model = stages_of[focus][0].model if focus is not None else None
    # rows: vGPUs of the focus model first (its path's vGPUs on top), then others, capped
    path_vgpus = sim.dispatch_paths.get(focus, [])
    used = sorted({b.vgpu for b in inside if b.model == focus_model}, key=lambda v: (v not in path_vgpus, _natural(v)))
    rows = used[:max_rows]
    for v in path_vgpus:
        if v not in rows:
            rows[-1:] = [v]
    y = {v: i for i, v in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.6), dpi=120)
    stage_colors = ["#9ecae1", "#a1d99b", "#fdd0a2", "#dadaeb"]
    for b in inside:
        if b.vgpu not in y:
            continue
        hl = b.dispatch_id == focus
        ax.broken_barh([((b.start_us - lo) / 1e3, (b.end_us - b.start_us) / 1e3)], (y[b.vgpu] - 0.4, 0.8),
                       facecolors="#d62728" if hl else stage_colors[b.stage % len(stage_colors)],
                       edgecolors="black" if hl else "white", linewidth=0.8 if hl else 0.3, zorder=3 if hl else 2)
        if hl or (b.end_us - b.start_us) > window_us / 25:
            ax.text((max(b.start_us, lo) - lo) / 1e3 + 0.3, y[b.vgpu], str(b.batch), va="center", fontsize=6,
                    color="white" if hl else "black", zorder=4)
    if focus is not None:
        bs = sorted(stages_of[focus], key=lambda x: x.stage)
        for a, c in zip(bs, bs[1:]):
            if a.vgpu in y and c.vgpu in y:
                ax.annotate("", xy=((c.start_us - lo) / 1e3, y[c.vgpu]), xytext=((a.end_us - lo) / 1e3, y[a.vgpu]),
                            arrowprops=dict(arrowstyle="->", color="#d62728", lw=1.2), zorder=5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, window_us / 1e3)
    ax.set_xlabel(f"time (ms) from t = {lo / 1e6:.2f} s; number = batch size; red = one dispatch's path "
                  "(arrows: transfers between stages)")
    ax.set_title(title or f"batches per vGPU of {focus_model}", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in stage_colors[:2]] + \
              [plt.Rectangle((0, 0), 1, 1, color="#d62728")]
    ax.legend(handles, ["stage 0", "stage 1", "highlighted path"], fontsize=7, loc="upper right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
