"""Run the Locust file headless in a child process (Locust's gevent patching stays out of the caller)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poolpipe_common.errors import InputError
from workloads.arrivals import parse_trace

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
REPO_ROOT = LOCUSTFILE.parent.parent


@dataclass(frozen=True)
class LoadTest:
    url: str  # gRPC endpoint host:port (the sidecar, or a Triton server)
    model: str
    rate_rps: float
    duration_s: float = 30.0
    trace: str = "poisson"
    slo_ms: float = 0.0
    timeout_ms: float = 0.0
    senders: int = 8
    seed: int = 0

    def command(self, out_dir: Path) -> list[str]:
        return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", self.url,
                "--model", self.model, "--trace", self.trace, "--rate", str(self.rate_rps),
                "--duration-s", str(self.duration_s), "--seed", str(self.seed), "--slo-ms", str(self.slo_ms),
                "--timeout-ms", str(self.timeout_ms), "--senders", str(self.senders),
                "--csv", str(out_dir / "locust"), "--html", str(out_dir / "report.html"),
                "--summary-json", str(out_dir / "summary.json"), "--loglevel", "WARNING", "--only-summary"]


def preflight(url: str, model: str) -> None:
    """Fail fast, with the reason, when the endpoint or the model cannot serve."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    try:
        if not client.is_model_ready(model):
            raise InputError(f"loadtest: model {model!r} is not ready on {url} (check the name with /v2/models)")
    except InferenceServerException as e:
        raise InputError(f"loadtest: cannot reach {url}: {str(e).splitlines()[0]}") from None
    finally:
        client.close()


def run_loadtest(test: LoadTest, out_dir: Path, timeout_s: float | None = None) -> dict[str, Any]:
    """Run one headless Locust test; returns the summary (also in out_dir/summary.json)."""
    if test.rate_rps <= 0 or test.duration_s <= 0:
        raise InputError("loadtest: --rate and --duration-s must be > 0")
    parse_trace(test.trace)  # a bad --trace fails here, in one line, not in the Locust child
    preflight(test.url, test.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    timeout_s = timeout_s or test.duration_s + 60
    proc = subprocess.run(test.command(out_dir), env=env, capture_output=True, text=True, timeout=timeout_s)
    (out_dir / "locust.log").write_text(proc.stdout + proc.stderr)
    summary = out_dir / "summary.json"
    if not summary.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InputError(f"loadtest against {test.url} produced no results (locust exit {proc.returncode}): {tail[0]}")
    return json.loads(summary.read_text())
