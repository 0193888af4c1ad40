"""Where a request's time goes through the sidecar: the client's send and receive times (time.monotonic(), taken
in the client's process, which on one machine shares the sidecar's clock) joined with the batch log's lines of
the dispatch that served it (``serve --batch-log``). For requests sent one at a time, each its own dispatch.

Segments, in order: the front's way in (client send -> the sidecar's arrival), the scheduler (arrival -> stage 0's
input at hand), then per stage the call's lead (sent -> compute start), its compute and its tail (compute end ->
answer received), between stages the hop (answer received -> the next stage's input at hand, including any wait
for the next stage's reservation, such as an emulated link), and the way out (last answer -> client receive).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _dispatches(lines: Sequence[dict]) -> list[list[dict]]:
    """The batch log's lines grouped by dispatch, each group in stage order, the groups by arrival."""
    by: dict[int, list[dict]] = {}
    for line in lines:
        by.setdefault(line["dispatch"], []).append(line)
    groups = [sorted(g, key=lambda s: s["stage"]) for g in by.values()]
    return sorted(groups, key=lambda g: g[0]["arrival_s"])


def segments(marks: Sequence[tuple[float, float]], lines: Sequence[dict]) -> dict[str, list[float]]:
    """Each segment's durations (ms) over the requests of ``marks`` (client send, receive) served by exactly one
    dispatch of ``lines`` (the batch log's lines) whose arrival falls between them; others are skipped."""
    groups = _dispatches(lines)
    out: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        out.setdefault(name, []).append(seconds * 1e3)

    for sent, received in marks:
        served = [g for g in groups if sent <= g[0]["arrival_s"] <= received]
        if len(served) != 1:
            continue
        stages = served[0]
        add("way in (client send -> sidecar arrival)", stages[0]["arrival_s"] - sent)
        add("scheduler (arrival -> stage 0 input at hand)", stages[0]["ready_s"] - stages[0]["arrival_s"])
        for i, s in enumerate(stages):
            if i > 0:
                add(f"hop {i - 1}->{i} (answer -> input at hand)", s["ready_s"] - stages[i - 1]["received_s"])
            add(f"stage {i} lead (sent -> compute start)", s["start_s"] - s["sent_s"])
            add(f"stage {i} compute", s["end_s"] - s["start_s"])
            add(f"stage {i} tail (compute end -> answer)", s["received_s"] - s["end_s"])
        add("way out (last answer -> client receive)", received - stages[-1]["received_s"])
        add("total", received - sent)
    return out


def medians(parts: dict[str, list[float]]) -> dict[str, float]:
    return {name: float(np.median(v)) for name, v in parts.items()}
