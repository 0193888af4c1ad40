"""``poolpipe loadtest``: a shortcut for a headless Locust run with poolpipe's Triton gRPC user."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loadtest", help="drive a Triton endpoint (the sidecar) with Locust, open loop",
        description="Run loadtest/locustfile.py headless against a KServe v2 gRPC endpoint: arrivals follow a "
                    "Poisson, bursty or replayed trace at a mean rate; prints SLO attainment, latencies and "
                    "errors, and writes Locust's CSV and HTML reports. The same locustfile works with "
                    "`locust -f loadtest/locustfile.py --host HOST:PORT --model NAME` (web UI).")
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC endpoint host:port (default: %(default)s)")
    p.add_argument("--model", required=True, help="model name")
    p.add_argument("--rate", type=float, required=True, help="mean offered load, requests per second")
    p.add_argument("--duration-s", type=float, default=30.0, help="seconds of arrivals (default: %(default)s)")
    p.add_argument("--trace", default="poisson",
                   help="poisson | bursty[:CV] | maf19:FILE | maf21:FILE | replay:FILE (default: %(default)s). "
                        "replay:FILE: real arrivals (a CSV with a TIMESTAMP column of dates, or one time in seconds "
                        "per line) with inter-arrival times scaled so the run offers --rate, the stretch replayed "
                        "keeping its burstiness; cyclic; --seed picks where in the trace it starts. replay:azure-code "
                        "(bursty, inter-arrival CV 13) "
                        "and replay:azure-conv (CV 1.1): the shipped Azure LLM inference traces of 2023 "
                        "(data/traces/azure-llm-2023)")
    p.add_argument("--slo-ms", type=float, default=0.0,
                   help="SLO for attainment (default: the model config's poolpipe_slo_us parameter)")
    p.add_argument("--timeout-ms", type=float, default=0.0, help="per-request client timeout sent to the server")
    p.add_argument("--senders", type=int, default=8, help="Locust users sharing the arrival schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("loadtest-out"), help="directory for CSV/HTML/JSON reports")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from loadtest.runner import LoadTest, run_loadtest

    test = LoadTest(args.url, args.model, args.rate, args.duration_s, args.trace, args.slo_ms, args.timeout_ms,
                    args.senders, args.seed)
    s = run_loadtest(test, args.out)
    t = Table(title=f"loadtest {args.model} @ {args.rate:g} rps ({args.trace}, {args.duration_s:g} s)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for k in ("sent", "succeeded", "failed", "unanswered", "throughput_rps", "slo_ms", "slo_attainment",
              "p50_ms", "p90_ms", "p99_ms", "send_lag_ms_p99"):
        v = s[k]
        t.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    for msg, n in s["errors"].items():
        t.add_row(f"error x{n}", msg)
    Console().print(t)
    print(f"reports: {args.out}/report.html, {args.out}/locust_stats.csv, {args.out}/summary.json")
    return 0 if s["unanswered"] == 0 else 1
