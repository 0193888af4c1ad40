"""The planner's pool of worker processes: candidate plans solved and measured side by side, so planning uses the
host's cores. A plan's search for its sustainable rate runs in a thread of the planning process; the points it judges
(and the MILPs of the candidate plans) run in the workers (planner.sustained.worker_process), the next point of a
search beside the pending one where a worker is idle (scheduler.sim.sustain), so even one plan's search uses two
cores. Every call is deterministic for its inputs, so the results equal those of running them in turn.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from planner.sustained.evaluators import evaluator
from planner.sustained.worker_process import WorkerProcess, default_jobs, take_prestarted
from plans.arrivals import Arrivals
from plans.plan_json import Plan
from poolpipe_common.overheads import Overheads
from scheduler.sim.sustain import Point, Precision, judge

Rates = dict[str, float]


class WorkerPool:
    """Up to ``jobs`` worker processes (None: one per core) running module-level functions; with one job, calls run
    in the calling thread and nothing is started. The workers start at once (or were: worker_process.prestart), so
    their imports (``preload``: the modules of the functions they will run) overlap the caller's work, and a worker
    takes calls only once it is ready; use as a context manager (the workers stop on exit, also on error)."""

    def __init__(self, jobs: int | None = None, preload: Sequence[str] = ()) -> None:
        self.size = jobs or default_jobs()
        self._todo: queue.Queue[tuple[Future, Callable, tuple] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._idle = 0
        self._workers: list[WorkerProcess] = []
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        if self.size > 1:
            ready = take_prestarted(self.size, preload)
            for w in ready + [WorkerProcess(preload) for _ in range(self.size - len(ready))]:
                self._workers.append(w)
                self._threads.append(threading.Thread(target=self._feed, args=(w,), daemon=True))
            for t in self._threads:
                t.start()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def inline(self) -> bool:
        return not self._workers

    def submit(self, fn: Callable, *args: Any, speculative: bool = False) -> Future | None:
        """``fn(*args)``'s future; None for a ``speculative`` call while no worker is idle (or running inline)."""
        fut: Future = Future()
        if self.inline:
            if speculative:
                return None
            _settle(fut, fn, args)
            return fut
        with self._lock:
            if speculative and self._idle <= self._todo.qsize():
                return None
        self._todo.put((fut, fn, args))
        return fut

    def busy(self) -> int:
        """Workers running a call now."""
        return sum(w.busy for w in self._workers)

    def map(self, fn: Callable, calls: Sequence[tuple]) -> list[Any]:
        """``[fn(*args) for args in calls]``, in the workers and this thread alike (calls that take milliseconds are
        done here before a worker has even started); the first error raised."""
        futures = [self.submit(fn, *args) for args in calls]
        while not all(f.done() for f in futures):  # type: ignore[union-attr]
            try:
                job = self._todo.get_nowait()
            except queue.Empty:
                break
            if job is None:  # closing: leave the sentinel for a feeder
                self._todo.put(None)
                break
            if job[0].set_running_or_notify_cancel():
                _settle(job[0], job[1], job[2])
        return [f.result() for f in futures]  # type: ignore[union-attr]

    def judge(self, point: Point, speculative: bool) -> Future | None:
        """A search's point runner (scheduler.sim.sustain.PointRunner)."""
        return self.submit(judge, point, speculative=speculative)

    def _feed(self, worker: WorkerProcess) -> None:
        """Hand queued calls to ``worker`` once it is ready until the pool closes or the worker dies (then to no one:
        the other workers go on; the last to die fails what is left). Until then the caller's map does them."""
        if not worker.ready():
            self._died(worker)
            return
        with self._lock:
            self._idle += 1
        while True:
            job = self._todo.get()
            if job is None:
                return
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._idle -= 1
            try:
                result = worker.call(fn, args, self._closing)
            except BaseException as e:  # noqa: BLE001 - the caller raises it
                with self._lock:
                    self._idle += 1
                fut.set_exception(e)
                if not worker.alive():
                    self._died(worker)
                    return
                continue
            with self._lock:  # idle before the caller hears: the search it wakes may offer a guess at once
                self._idle += 1
            fut.set_result(result)

    def _died(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._workers = [w for w in self._workers if w is not worker]
            last = not self._workers and not self._closing.is_set()
        while last:
            try:
                job = self._todo.get_nowait()
            except queue.Empty:
                return
            if job is None:  # a feeder's stop: not this thread's to take
                self._todo.put(None)
                return
            if job[0].set_running_or_notify_cancel():
                job[0].set_exception(RuntimeError(f"every plan-measuring worker died (the last: pid {worker.pid}); "
                                                  "their stderr above says why"))

    def close(self) -> None:
        """Stop the workers: queued calls not started are cancelled, and a worker still busy (a search's guess that
        no search asked for after all) is killed rather than waited for."""
        self._closing.set()
        workers = list(self._workers)  # a killed one leaves the list on its way out
        while True:
            try:
                job = self._todo.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for w in workers:
            if w.busy:
                w.proc.kill()
        for _ in self._threads:
            self._todo.put(None)
        for t in self._threads:
            t.join()
        for w in workers:  # every worker told first, then waited for: they exit side by side
            w.close_stdin()
        for w in workers:
            w.stop()
        self._workers, self._threads = [], []


def _settle(fut: Future, fn: Callable, args: tuple) -> None:
    try:
        fut.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 - the caller raises it, as from a worker
        fut.set_exception(e)


def measure_all(name: str, plans: Sequence[Plan], arrivals: Arrivals, costs: Overheads,
                jobs: int | WorkerPool | None = None, done: Callable[[], object] | None = None,
                precisions: Sequence[Precision | None] | None = None) -> list[Rates]:
    """Each plan's sustainable rates by the evaluator ``name`` (each to its precision: scheduler.sim.sustain), in
    order; the searches side by side, their points in ``jobs`` (a pool, or how many processes: None one per core, 1
    this process). ``done`` is called once per plan measured (a progress bar's update)."""
    done = done or (lambda: None)
    precisions = list(precisions) if precisions is not None else [None] * len(plans)
    _, evaluate = evaluator(name)
    if name == "analytic":  # the closed form takes milliseconds: no process is worth starting
        jobs = 1
    if not isinstance(jobs, WorkerPool):
        with WorkerPool(1 if len(plans) == 0 else jobs) as pool:
            return measure_all(name, plans, arrivals, costs, pool, done, precisions)
    pool = jobs
    results: list[Rates | BaseException | None] = [None] * len(plans)

    def measure(i: int) -> None:
        try:
            results[i] = evaluate(plans[i], arrivals, costs, precisions[i], points=pool.judge)
            done()
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            results[i] = e

    if pool.inline:
        for i in range(len(plans)):
            measure(i)
    else:
        threads = [threading.Thread(target=measure, args=(i,), daemon=True) for i in range(len(plans))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
