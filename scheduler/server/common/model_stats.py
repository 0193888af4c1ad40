"""Per-model statistics as Triton keeps them (the statistics extension and the ``nv_inference_*`` metrics), filled
from what the sidecar measures of a planned model.

For a pooled pipeline the durations mean (all per successful request, as Triton counts them):
queue: arrival at the sidecar until its batch left the scheduler's queue; compute input: until the first stage's
compute began (stacking, sending, the server's input handling); compute infer: the first stage's compute start to
the last stage's compute end (every stage and the hops between them); compute output: the last stage's compute end
until the answer (its response, splitting, writing client shared memory). Batch statistics: per executed batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tritonclient.grpc import service_pb2

from scheduler.server.common import latency_summary
from scheduler.server.common.latency_summary import LatencySummaries

# Triton's reasons for a failed request (label ``reason`` of nv_inference_request_failure)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass
class Duration:
    """A count and a cumulative duration (ns), Triton's StatisticDuration."""

    count: int = 0
    ns: int = 0

    def add(self, us: float) -> None:
        self.count += 1
        self.ns += max(int(us * 1e3), 0)

    def fill(self, proto: service_pb2.StatisticDuration) -> None:
        proto.count, proto.ns = self.count, self.ns


@dataclass
class BatchDurations:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class RequestMarks:
    """When (µs, monotonic) a request's first batch left the queue, its first stage's compute began and its last
    stage's compute ended; None until measured."""

    ready_us: float | None = None
    start_us: float | None = None
    end_us: float | None = None

    def first_stage(self, ready_us: float, start_us: float) -> None:
        self.ready_us = ready_us if self.ready_us is None else min(self.ready_us, ready_us)
        self.start_us = start_us if self.start_us is None else min(self.start_us, start_us)

    def last_stage(self, end_us: float) -> None:
        self.end_us = end_us if self.end_us is None else max(self.end_us, end_us)


@dataclass
class ModelStats:
    """One model's statistics since the sidecar started (kept across reloads)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inferences: int = 0
    executions: int = 0
    last_ms: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    batches: dict[int, BatchDurations] = field(default_factory=dict)
    summaries: LatencySummaries = field(default_factory=LatencySummaries)  # --metrics-config summary_latencies

    def succeeded(self, arrival_us: float, marks: RequestMarks, answer_us: float, rows: int) -> None:
        """One answered request; a mark not measured falls back to its neighbour (the counts stay equal, as
        perf_analyzer requires)."""
        def within(t: float | None, lo: float, default: float) -> float:  # in order: arrival..answer
            return min(max(default if t is None else t, lo), answer_us)
        ready = within(marks.ready_us, arrival_us, arrival_us)
        start = within(marks.start_us, ready, ready)
        end = within(marks.end_us, start, answer_us)
        self.success.add(answer_us - arrival_us)
        self.queue.add(ready - arrival_us)
        self.compute_input.add(start - ready)
        self.compute_infer.add(end - start)
        self.compute_output.add(answer_us - end)
        if latency_summary.SETTINGS[0].enabled:
            self.summaries.observe(answer_us - arrival_us, ready - arrival_us, start - ready, end - start,
                                   answer_us - end)
        self.inferences += rows
        self.last_ms = int(time.time() * 1e3)

    def failed(self, arrival_us: float, now_us: float, reason: str) -> None:
        self.fail.add(now_us - arrival_us)
        self.failures[reason if reason in self.failures else "OTHER"] += 1

    def executed(self, batch: int, ready_us: float, start_us: float, end_us: float, recv_us: float) -> None:
        """One batch through the whole pipeline: its input, infer and output durations at its size."""
        b = self.batches.setdefault(batch, BatchDurations())
        b.compute_input.add(start_us - ready_us)
        b.compute_infer.add(end_us - start_us)
        b.compute_output.add(recv_us - end_us)

    def to_proto(self, name: str, version: str = "1") -> service_pb2.ModelStatistics:
        s = service_pb2.ModelStatistics(name=name, version=version, last_inference=self.last_ms,
                                        inference_count=self.inferences, execution_count=self.executions)
        i = s.inference_stats
        for src, dst in ((self.success, i.success), (self.fail, i.fail), (self.queue, i.queue),
                         (self.compute_input, i.compute_input), (self.compute_infer, i.compute_infer),
                         (self.compute_output, i.compute_output)):
            src.fill(dst)
        for size in sorted(self.batches):
            b, out = self.batches[size], s.batch_stats.add(batch_size=size)
            b.compute_input.fill(out.compute_input)
            b.compute_infer.fill(out.compute_infer)
            b.compute_output.fill(out.compute_output)
        return s
