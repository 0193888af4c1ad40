"""Candidate plans measured side by side: each evaluator call runs in one of up to ``jobs`` worker processes, so
planning uses the host's cores (the simulator's bisection over one plan is sequential; the plans are not).

The workers are fresh interpreters running this module (``python -m planner.sustained.measure_pool``), not
multiprocessing's children: those re-import the caller's ``__main__``, and a script that plans without an
``if __name__ == "__main__"`` guard would plan again in each. A worker reads pickled jobs on its stdin and
writes each result (or the exception it raised) on a private copy of its stdout; whatever a library prints goes
to stderr. Every evaluator is deterministic for its inputs, so the results equal those of measuring in turn.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from planner.sustained.evaluators import evaluator
from plans.arrivals import Arrivals
from plans.plan_json import Plan
from poolpipe_common.overheads import Overheads
from scheduler.sim.sustain import Precision

Rates = dict[str, float]
STOP_WAIT_S = 5.0  # a worker whose stdin closed exits at once; one that does not is killed after this


def default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def measure_all(name: str, plans: Sequence[Plan], arrivals: Arrivals, costs: Overheads,
                jobs: int | None = None, done: Callable[[], object] | None = None,
                precisions: Sequence[Precision | None] | None = None) -> list[Rates]:
    """Each plan's sustainable rates by the evaluator ``name`` (each to its precision: scheduler.sim.sustain), in
    order; in up to ``jobs`` processes (None: one per core; 1: in this process). ``done`` is called once per plan
    measured (a progress bar's update)."""
    done = done or (lambda: None)
    precisions = list(precisions) if precisions is not None else [None] * len(plans)
    workers = min(jobs or default_jobs(), len(plans))
    if workers <= 1 or name == "analytic":  # the closed form takes milliseconds: no process is worth starting
        _, evaluate = evaluator(name)
        out = []
        for p, precision in zip(plans, precisions, strict=True):
            out.append(evaluate(p, arrivals, costs, precision))
            done()
        return out
    todo: queue.Queue[tuple[int, Plan, Precision | None]] = queue.Queue()
    for i, (p, precision) in enumerate(zip(plans, precisions, strict=True)):
        todo.put((i, p, precision))
    results: list[Rates | BaseException | None] = [None] * len(plans)
    pool: list[_Worker] = []
    try:
        pool.extend(_Worker() for _ in range(workers))
        threads = [threading.Thread(target=w.drain, args=(todo, results, (name, arrivals, costs), done), daemon=True)
                   for w in pool]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for w in pool:
            w.stop()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


class _Worker:
    """One worker process and the thread in this process that feeds it jobs."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the modules this process has
        self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env)

    def drain(self, todo: queue.Queue, results: list, shared: tuple[str, Arrivals, Overheads],
              done: Callable[[], object]) -> None:
        """Measure jobs from ``todo`` until it is empty or this worker fails (its error is the job's result)."""
        while True:
            try:
                i, plan, precision = todo.get_nowait()
            except queue.Empty:
                return
            try:
                pickle.dump((plan, precision, *shared), self.proc.stdin)  # type: ignore[arg-type]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                results[i] = pickle.load(self.proc.stdout)  # type: ignore[arg-type]
            except (OSError, EOFError, pickle.UnpicklingError) as e:
                results[i] = RuntimeError(f"a plan-measuring worker (pid {self.proc.pid}) died: {e!r}; its stderr "
                                          "above says why")
                return
            if isinstance(results[i], BaseException):
                return
            done()

    def stop(self) -> None:
        """Close its stdin (it exits at EOF); kill it if it does not."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()  # type: ignore[union-attr]


def serve(jobs: BinaryIO, answers: BinaryIO) -> None:
    """The worker's loop: (plan, precision, evaluator name, arrivals, costs) in, the rates or the exception raised
    out."""
    while True:
        try:
            plan, precision, name, arrivals, costs = pickle.load(jobs)
        except EOFError:
            return
        result: Any
        try:
            result = evaluator(name)[1](plan, arrivals, costs, precision)
        except Exception as e:  # noqa: BLE001 - handed to the planning process, which raises it
            result = e
        try:
            data = pickle.dumps(result)
        except Exception:  # noqa: BLE001 - an exception that does not pickle still reaches the caller, as text
            data = pickle.dumps(RuntimeError(repr(result)))
        answers.write(data)
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")  # the results' own channel; stray prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
