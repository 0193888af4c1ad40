"""The planner's worker processes themselves (planner.sustained.measure_pool hands them calls): fresh interpreters
running this module (``python -m planner.sustained.worker_process MODULE...``), not multiprocessing's children: those
re-import the caller's ``__main__``, and a script that plans without an ``if __name__ == "__main__"`` guard would
plan again in each. A worker imports its modules, says READY, then reads pickled calls (a module-level function and
its arguments) on its stdin and writes each result (or the exception it raised) on a private copy of its stdout;
whatever a library prints goes to stderr. This module imports nothing but the standard library, so a command can
start workers (``prestart``) before its own imports: theirs then overlap, and the pool that takes them finds them
ready.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

READY = "ready"  # a worker's first message: its imports are done
STOP_WAIT_S = 5.0  # a worker whose stdin closed exits at once; one that does not is killed after this
_prestarted: list[WorkerProcess] = []  # started by prestart, not yet taken by a pool


def default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prestart(count: int, preload: Sequence[str]) -> None:
    """Start ``count`` workers importing ``preload`` now, for the next pools that ask for them (take_prestarted);
    those no pool takes are stopped when this process exits."""
    if not _prestarted:
        atexit.register(_stop_leftovers)
    _prestarted.extend(WorkerProcess(preload) for _ in range(count))


def take_prestarted(count: int, preload: Sequence[str]) -> list[WorkerProcess]:
    """Up to ``count`` prestarted workers that import ``preload`` (they are the caller's to stop)."""
    taken = [w for w in _prestarted if w.preload == tuple(preload) and w.alive()][:count]
    _prestarted[:] = [w for w in _prestarted if w not in taken]
    return taken


def _stop_leftovers() -> None:
    while _prestarted:
        _prestarted.pop().stop()


class WorkerProcess:
    """One worker process: a fresh interpreter running this module, ``preload`` imported."""

    def __init__(self, preload: Sequence[str] = ()) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # the modules this process has
        self.preload = tuple(preload)
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.pid = self.proc.pid
        self.busy = False  # running a call now (or starting: a pool that closes meanwhile kills it)

    def ready(self) -> bool:
        """Wait for the worker's imports; False if it died first."""
        self.busy = True
        try:
            return pickle.load(self.proc.stdout) == READY  # type: ignore[arg-type]
        except (OSError, EOFError, pickle.UnpicklingError):
            return False
        finally:
            self.busy = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, fn: Callable, args: tuple, closing: threading.Event) -> Any:
        """``fn(*args)`` in the worker; what it raised is raised here. ``closing``: the pool is closing, so a
        worker killed meanwhile was killed on purpose."""
        self.busy = True
        try:
            pickle.dump((fn, args), self.proc.stdin)  # type: ignore[arg-type]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            ok, result = pickle.load(self.proc.stdout)  # type: ignore[arg-type]
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self.proc.poll()
            if closing.is_set():
                raise RuntimeError("the plan-measuring pool closed before this call finished") from None
            raise RuntimeError(f"a plan-measuring worker (pid {self.pid}) died: {e!r}; its stderr above says "
                               "why") from None
        finally:
            self.busy = False
        if not ok:
            raise result
        return result

    def close_stdin(self) -> None:
        """Tell it to exit (it does at EOF)."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

    def stop(self) -> None:
        """Close its stdin (it exits at EOF); kill it if it does not."""
        self.close_stdin()
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()  # type: ignore[union-attr]


def serve(calls: BinaryIO, answers: BinaryIO) -> None:
    """The worker's loop: (function, arguments) in, (True, the result) or (False, the exception raised) out."""
    while True:
        try:
            fn, args = pickle.load(calls)
        except EOFError:
            return
        try:
            answer = (True, fn(*args))
        except Exception as e:  # noqa: BLE001 - handed to the planning process, which raises it
            answer = (False, e)
        try:
            data = pickle.dumps(answer)
        except Exception:  # noqa: BLE001 - an exception that does not pickle still reaches the caller, as text
            data = pickle.dumps((False, RuntimeError(repr(answer[1]))))
        answers.write(data)
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")  # the results' own channel; stray prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for module in sys.argv[1:]:  # what the calls will need, imported before the pool hands this worker any
        importlib.import_module(module)
    pickle.dump(READY, answers)
    answers.flush()
    serve(sys.stdin.buffer, answers)
    answers.close()
    sys.stderr.flush()
    os._exit(0)  # nothing left to tear down that the planner waits for (an interpreter's teardown took ~0.1 s)


if __name__ == "__main__":
    main()
