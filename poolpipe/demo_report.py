"""The demo's report: the summary table and last line, the attainment-vs-load and batch-timeline plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LABELS = {"ppipe": "poolpipe (ppipe plan, sidecar)", "np": "NP (np plan, sidecar)",
          "triton-native": "Triton-native (dynamic batcher)", "sim-ppipe": "simulator's prediction (poolpipe)"}


def max_load_at(runs: list[dict[str, Any]], system: str) -> float:
    """Largest tested load factor with >= 99 % attainment before the first one below it."""
    from poolpipe.load_search import max_passing

    return max_passing({r["load_factor"]: r["attainment"] for r in runs if r["system"] == system})


def print_summary(result: Any, console: Any) -> None:
    from rich.table import Table

    a = result.answers
    console.print(f"part 1: {a['requests']} requests through the {a['stages']}-stage pipeline equal ONNX Runtime "
                  f"(max abs difference {a['max_abs_diff']:.1e})")
    p = result.paper
    t = Table(title=f"part 2: {p['model']} on {p['cluster']}, SLO {p['slo_ms']:.0f} ms (time x{p['time_scale']:g}); "
                    f"load factor 1.0 = ppipe plan {p['ppipe_rps']:.1f} req/s, np plan {p['np_rps']:.1f} req/s",
              title_justify="left")
    t.add_column("load", justify="right")
    t.add_column("req/s", justify="right")
    systems = [s for s in LABELS if any(r["system"] == s for r in result.runs)]
    for s in systems:
        t.add_column(f"{s} attain." if s != "sim-ppipe" else "sim attain.", justify="right")
    for s in ("ppipe", "np", "triton-native"):
        t.add_column(f"{s} p99 ms", justify="right")
    by = {(r["system"], r["load_factor"]): r for r in result.runs}
    for lf in sorted({r["load_factor"] for r in result.runs}):
        cells = [f"{by[(s, lf)]['attainment']:.1%}" if (s, lf) in by else "-" for s in systems]
        p99 = [f"{by[(s, lf)]['p99_ms']:.0f}" if by.get((s, lf), {}).get("p99_ms") else "-"
               for s in ("ppipe", "np", "triton-native")]
        t.add_row(f"{lf:g}", f"{lf * p['ppipe_rps']:.1f}", *cells, *p99)
    console.print(t)
    best = {s: max_load_at(result.runs, s) for s in systems}
    console.print("highest tested load with >= 99% attainment: "
                  + ", ".join(f"{LABELS[s]} {v:g}" for s, v in best.items()))
    held = by.get(("ppipe", p.get("promise_lf")))
    if held is not None:
        from poolpipe.load_search import TARGET

        verdict = "held" if held["attainment"] >= TARGET else "NOT held"
        console.print(f"the ppipe plan's promise, {p['promise_rps']:.1f} req/s at >= 99 % (load {p['promise_lf']:g}): "
                      f"{verdict} live, {held['attainment']:.2%} SLO attainment (emulated)")
    pp, tr = best.get("ppipe", 0.0), best.get("triton-native", 0.0)
    ratio = f"{pp / tr:.2f}x" if tr else "n/a: Triton-only met 99% at no tested load"
    console.print(f"highest tested load with >= 99% SLO attainment: poolpipe {pp:g}, Triton-only {tr:g} "
                  f"(ratio {ratio})")


def plot(result: Any, out: Path) -> list[Path]:
    """attainment.png (every system and the prediction vs load) and timeline.png (part 1's batches per vGPU)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"ppipe": ("o-", "tab:blue"), "np": ("^-", "tab:green"), "triton-native": ("s-", "tab:orange"),
              "sim-ppipe": ("x--", "tab:purple")}
    for system, label in LABELS.items():
        rs = sorted((r for r in result.runs if r["system"] == system), key=lambda r: r["load_factor"])
        if rs:
            style, color = styles[system]
            ax.plot([r["load_factor"] for r in rs], [100 * r["attainment"] for r in rs], style, label=label,
                    color=color)
    ax.axhline(99, color="grey", lw=0.8, ls=":")
    p = result.paper
    ax.set_xlabel(f"load factor (x ppipe plan throughput, {p['ppipe_rps']:.1f} req/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(f"{p['model']} on {p['cluster']}\nSLO {p['slo_ms']:.0f} ms (time x{p['time_scale']:g}); "
                 ">= 99 % above the dotted line", fontsize=9)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_ylim(min([90.0] + [100 * r["attainment"] - 2 for r in result.runs]), 100.5)
    fig.tight_layout()
    paths.append(out / "attainment.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    batches = _read_batches(out / "batches.jsonl")
    if batches:
        paths.append(out / "timeline.png")
        _timeline(batches, paths[-1], plt)
    return paths


def _read_batches(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _timeline(batches: list[dict[str, Any]], path: Path, plt: Any, window_s: float = 1.0) -> None:
    """Batches per vGPU over a window at the end of the run; one dispatch's path is highlighted."""
    end = max(b["end_s"] for b in batches)
    start = end - window_s - 0.5
    shown = [b for b in batches if start <= b["start_s"] <= start + window_s]
    vgpus = sorted({b["vgpu"] for b in batches})
    multi = [d for d in {b["dispatch"] for b in shown} if sum(b["dispatch"] == d for b in shown) > 1]
    highlight = sorted(multi)[len(multi) // 2] if multi else None
    fig, ax = plt.subplots(figsize=(9, 1 + 0.6 * len(vgpus)))
    for b in shown:
        y = vgpus.index(b["vgpu"])
        hot = b["dispatch"] == highlight
        ax.barh(y, (b["end_s"] - b["start_s"]) * 1e3, left=(b["start_s"] - start) * 1e3, height=0.6,
                color="tab:red" if hot else "tab:blue", alpha=0.9 if hot else 0.5, edgecolor="black", lw=0.3)
        ax.text((b["start_s"] - start) * 1e3, y, str(b["batch"]), va="center", fontsize=6)
    ax.set_yticks(range(len(vgpus)), vgpus)
    ax.set_xlabel("time (ms); number = batch size; red = one batch's path through the pool")
    ax.set_title("batches per vGPU (measured compute intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
