"""Both cores on one hard MILP: two HiGHS searches that differ only in seed and branching reliability run
in two threads (highspy releases the GIL while it solves); the first to finish its proof stops the other.

HiGHS's branch and bound runs on one thread, and its time to close the last 0.1 % of a gap varies 2x
with the seed on our hardest plans (5-14 s for fsaf on 25 L4 + 75 P4); the race takes the faster of
two draws. Either search's bound is valid, so a race stopped by the time limit keeps the better
incumbent and the tighter bound.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

# The second search: another seed, and pseudo-costs trusted only after more strong-branching samples.
SECOND_SEARCH = {"random_seed": 3, "mip_pscost_minreliable": 16}


def worth_racing() -> bool:
    """A race needs a second core (os.sched_getaffinity: the cores this process may use)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # not Linux
        return (os.cpu_count() or 1) >= 2


def race(make: Callable[[dict[str, Any]], Any]) -> tuple[Any, list[Any]]:
    """Run ``make(options)()``'s Highs instances, one with HiGHS's defaults and one with SECOND_SEARCH, in
    two threads; returns the instance that finished first and both (the loser interrupted)."""
    stop = threading.Event()

    def interrupt(event: Any) -> None:
        if stop.is_set():
            event.interrupt()

    solvers = [make({}), make(SECOND_SEARCH)]
    for h in solvers:
        h.cbMipInterrupt += interrupt
    finished: list[Any] = []
    errors: list[BaseException] = []

    def run(h: Any) -> None:
        try:
            h.run()
            finished.append(h)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)
        finally:
            stop.set()

    threads = [threading.Thread(target=run, args=(h,), name="highs-race", daemon=True) for h in solvers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return finished[0], solvers
