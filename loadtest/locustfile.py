"""Locust load test of a Triton (KServe v2) endpoint, e.g. the poolpipe sidecar, over gRPC with tritonclient.

Open loop: arrivals follow a schedule (Poisson, bursty, an Azure Functions trace, or real arrivals
replayed with ``replay:FILE`` scaled to the rate, from the simulator's workload generators), not the
responses, so an overloaded server sees the load it would see in production. Each request is reported
to Locust (latency, success, or the server's error message); a JSON summary with SLO attainment and
how late requests left after their scheduled times is written at the end when asked.

    locust -f loadtest/locustfile.py --headless --host 127.0.0.1:8001 \
        --model resnet --trace poisson --rate 50 --duration-s 30 --slo-ms 100 \
        --csv out/run --html out/run.html --summary-json out/run.json
"""

from __future__ import annotations

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # gRPC's C core must cooperate with Locust's gevent loop

import itertools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from locust import User, events, task  # noqa: E402
from locust.shape import LoadTestShape  # noqa: E402

from loadtest.payload import request_inputs  # noqa: E402
from loadtest.summary import RunSummary  # noqa: E402
from poolpipe_common.errors import InputError  # noqa: E402
from workloads.arrivals import arrival_times  # noqa: E402

TRACE_HELP = ("arrival process: poisson | bursty[:CV] | maf19:FILE | maf21:FILE | replay:FILE. replay: real "
              "arrivals (a CSV with a TIMESTAMP column, or seconds one per line) scaled so the run offers --rate, "
              "the stretch replayed keeping its burstiness, cyclic, the start in the trace chosen by --seed; "
              "replay:azure-code and replay:azure-conv "
              "are the shipped Azure LLM inference traces (data/traces/azure-llm-2023)")


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    g = parser.add_argument_group("poolpipe")
    g.add_argument("--model", type=str, default="", help="model name on the server (required)")
    g.add_argument("--trace", type=str, default="poisson", help=TRACE_HELP)
    g.add_argument("--rate", type=float, default=10.0, help="mean offered load, requests per second")
    g.add_argument("--duration-s", type=float, default=30.0, help="seconds of arrivals (then in-flight requests drain)")
    g.add_argument("--seed", type=int, default=0, help="seed of the arrival process and input data")
    g.add_argument("--slo-ms", type=float, default=0.0,
                   help="latency SLO for attainment; 0 = read parameters.poolpipe_slo_us from the model config")
    g.add_argument("--timeout-ms", type=float, default=0.0,
                   help="client timeout sent with each request (tightens the sidecar's deadline); 0 = none")
    g.add_argument("--senders", type=int, default=8, help="Locust users sharing the schedule")
    g.add_argument("--summary-json", type=str, default="", help="write a JSON summary (attainment, latencies) here")


class _Run:
    """State shared by the users of one test run: the schedule, the clock origin, the summary."""

    schedule: np.ndarray = np.empty(0)
    t0: float = 0.0
    summary: RunSummary | None = None
    counter = itertools.count()


@events.test_start.add_listener
def _on_test_start(environment, **_kw) -> None:
    o = environment.parsed_options
    if not o.model:
        raise SystemExit("loadtest: --model is required (the model name on the server)")
    try:
        _Run.schedule = arrival_times(o.trace, o.rate, o.duration_s, o.seed)
    except InputError as e:
        raise SystemExit(f"loadtest: {e}") from None
    _Run.summary = RunSummary(model=o.model, trace=o.trace, rate_rps=o.rate, duration_s=o.duration_s)
    _Run.counter = itertools.count()
    _Run.t0 = time.monotonic() + 1.0  # a second for the senders to connect


@events.quitting.add_listener
def _on_quitting(environment, **_kw) -> None:
    o = environment.parsed_options
    if _Run.summary is not None and o.summary_json:
        Path(o.summary_json).write_text(json.dumps(_Run.summary.to_dict(), indent=1) + "\n")


class TritonGrpcUser(User):
    """One sender: fires its share of the schedule's arrivals, each in its own greenlet."""

    def on_start(self) -> None:
        o = self.environment.parsed_options
        self.index = next(_Run.counter)
        self.client = grpcclient.InferenceServerClient(self.host or "127.0.0.1:8001")
        meta = self.client.get_model_metadata(o.model, as_json=True)
        config = self.client.get_model_config(o.model, as_json=True)["config"]
        self.inputs = request_inputs(meta, seed=o.seed + self.index)
        self.outputs = [grpcclient.InferRequestedOutput(t["name"]) for t in meta["outputs"]]
        slo_us = float(config.get("parameters", {}).get("poolpipe_slo_us", {}).get("string_value", 0) or 0)
        self.slo_s = o.slo_ms / 1e3 if o.slo_ms > 0 else slo_us / 1e6
        if _Run.summary is not None and self.slo_s:
            _Run.summary.slo_ms = self.slo_s * 1e3
        self.timeout_us = int(o.timeout_ms * 1e3) if o.timeout_ms > 0 else None

    def on_stop(self) -> None:
        self.client.close()

    @task
    def replay(self) -> None:
        o = self.environment.parsed_options
        mine = _Run.schedule[self.index % o.senders::o.senders] if self.index < o.senders else []
        pending = []
        for t in mine:
            delay = _Run.t0 + t - time.monotonic()
            if delay > 0:
                gevent.sleep(delay)
            pending.append(gevent.spawn(self._infer, _Run.t0 + t))
        gevent.joinall(pending)
        gevent.sleep(3600)  # done: wait for the shape to end the run

    def _infer(self, due: float) -> None:
        o = self.environment.parsed_options
        if _Run.summary is not None:
            _Run.summary.started(time.monotonic() - due)
        start = time.perf_counter()
        exc = None
        nbytes = 0
        try:
            result = self.client.infer(o.model, self.inputs, outputs=self.outputs, client_timeout=None,
                                       timeout=self.timeout_us)
            nbytes = sum(len(b) for b in result.get_response().raw_output_contents)
        except Exception as e:  # the server's message is the failure Locust reports
            exc = e
        elapsed = time.perf_counter() - start
        if _Run.summary is not None:
            _Run.summary.record(elapsed, None if exc is None else _message(exc), self.slo_s)
        self.environment.events.request.fire(request_type="grpc", name=o.model, response_time=elapsed * 1e3,
                                             response_length=nbytes, exception=exc, context={})


def _message(exc: Exception) -> str:
    msg = exc.message() if isinstance(exc, grpcclient.InferenceServerException) else str(exc)
    return (msg or type(exc).__name__).splitlines()[0][:200]


class ScheduleShape(LoadTestShape):
    """Starts the senders at once, then ends the run when the arrivals are over and in-flight work drained."""

    max_drain_s = 10.0

    def tick(self):
        o = self.runner.environment.parsed_options
        t = self.get_run_time()
        arrivals_over = t > o.duration_s + 1.5
        drained = _Run.summary is None or _Run.summary.in_flight == 0
        if (arrivals_over and drained) or t > o.duration_s + 1.5 + self.max_drain_s:
            return None
        return o.senders, o.senders
