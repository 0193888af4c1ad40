"""The sidecar's start-up line for a pipeline that leaves no slack under its SLO (no tritonserver needed: the
line's arithmetic; tests/test_sidecar_readiness.py sees a sidecar log it)."""

from __future__ import annotations

from model_repository_gen.manifest import PipelineInfo, StageInfo
from scheduler.server.planned.calibration import StageOverheads, no_slack_warning


def test_the_no_slack_line_counts_the_transfers_between_servers() -> None:
    """The driver counts a pipeline's transfers between servers in its slack (Topology.idle_us); the start-up line
    did not, so a pipeline whose compute, lead and tail fit but whose transfer did not was shed without a word.
    Both stages here fit an 8 ms SLO less the 1 ms margin alone (6.6 ms) and miss it with a 0.6 ms transfer."""
    stages = tuple(StageInfo(f"m_{k}", (k, k + 1), "T4", 1, (f"v{k}",), (), (), {1: 3000.0}) for k in range(2))
    p = PipelineInfo("m/0", 1, 100.0, 6000.0, stages)
    costs = StageOverheads([{1: 200.0}, {1: 200.0}], [{1: 100.0}, {1: 100.0}])
    assert no_slack_warning(p, 8000.0, costs) is None
    line = no_slack_warning(p, 8000.0, costs, transfer_us=600.0)
    assert line is not None and "7.2 ms at batch 1" in line and "0.6 ms of it transfers between servers" in line
