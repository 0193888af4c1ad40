"""The demo's report: a summary table, the attainment-vs-load and batch-timeline plots, metric scraping."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

_BUSY = re.compile(r'^\w*vgpu_busy_seconds_total\{vgpu="([^"]+)"\} ([0-9.eE+-]+)$', re.M)


def scrape_vgpu_busy(metrics_port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """Cumulative measured compute seconds per vGPU, from the sidecar's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in _BUSY.finditer(text)}


def max_load_at(runs: list[dict[str, Any]], system: str, target: float = 0.99) -> float:
    """Largest load factor whose attainment reached ``target`` (0 if none did)."""
    ok = [r["load_factor"] for r in runs if r["system"] == system and (r["slo_attainment"] or 0) >= target]
    return max(ok, default=0.0)


def print_summary(result: Any, console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"measured: SLO {result.slo_ms:.1f} ms, planned throughput {result.planned_rps:.1f} req/s",
              title_justify="left")
    for col in ("load", "offered rps", "system", "attainment", "in-SLO rps", "ok rps", "shed/failed", "p50 ms",
                "p99 ms"):
        t.add_column(col, justify="right")
    for r in sorted(result.runs, key=lambda r: (r["load_factor"], r["system"])):
        t.add_row(f"{r['load_factor']:g}", f"{r['offered_rps']:.1f}", r["system"], f"{r['slo_attainment']:.1%}",
                  f"{r['slo_attainment'] * r['offered_rps']:.1f}", f"{r['throughput_rps']:.1f}", str(r["failed"]),
                  f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}")
    console.print(t)
    u = Table(title="vGPU utilization through the sidecar (measured compute time / wall time)", title_justify="left")
    u.add_column("load", justify="right")
    vgpus = sorted({g for per in result.vgpu_utilization.values() for g in per})
    for g in vgpus:
        u.add_column(g, justify="right")
    for lf, per in result.vgpu_utilization.items():
        u.add_row(lf, *(f"{per.get(g, 0.0):.0%}" for g in vgpus))
    console.print(u)
    pp, tr = max_load_at(result.runs, "poolpipe"), max_load_at(result.runs, "triton")
    ratio = f"{pp / tr:.2f}x" if tr else "n/a (Triton-only met 99% at no tested load)"
    console.print(f"highest tested load with >= 99% SLO attainment: poolpipe {pp:g}, Triton-only {tr:g} "
                  f"(ratio {ratio})")


def plot(result: Any, out: Path) -> list[Path]:
    """attainment.png (both systems vs load) and timeline.png (batches per vGPU, from the sidecar's log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, style in (("poolpipe", "o-"), ("triton", "s--")):
        rs = sorted((r for r in result.runs if r["system"] == system), key=lambda r: r["load_factor"])
        label = "poolpipe (sidecar, pooled pipeline)" if system == "poolpipe" else "Triton only (dynamic batcher)"
        ax.plot([r["load_factor"] for r in rs], [100 * r["slo_attainment"] for r in rs], style, label=label)
    ax.axhline(99, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("load factor (x planned throughput)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(f"SLO {result.slo_ms:.0f} ms, planned {result.planned_rps:.0f} req/s (measured)")
    ax.legend(loc="lower left")
    ax.set_ylim(0, 102)
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
