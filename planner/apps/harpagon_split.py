"""Splitting an application's end-to-end SLO into per-module latency budgets (Harpagon §III-D).

An application is a DAG of modules, each with its request rate and its candidate configurations
(planner.apps.harpagon_module). A split gives each module a budget such that the budgets along every source-to-sink
path sum to at most the SLO; each module is then scheduled by Harpagon's module scheduler within its budget, and
the split's cost is the sum of the modules' costs. Three ways to split:

- ``uniform``: every module gets SLO / (modules on the longest path), the baseline;
- ``harpagon``: Algorithm 2 (from each module's costliest, fastest configuration set, repeatedly move the module
  whose next set saves the most cost per unit of latency spent while the DAG still meets the SLO), then the
  slack no path needs is given back to the modules (Harpagon's latency reassigner), as in every split;
- ``optimal``: a MILP over each module's exact cost steps (the budgets where its schedule changes), the least
  total cost with every path within the SLO (small applications: one row per path).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from planner.apps.harpagon_module import Config, ModuleSchedule, schedule_module
from planner.solvers.milp_solvers import MilpArrays, solve_milp
from poolpipe_common.errors import InputError

SPLITS = ("harpagon", "optimal", "uniform")
_EPS = 1e-9
MAX_STEPS = 4000  # cost steps kept per module for the MILP (the step search stops there; exact below it)


@dataclass(frozen=True)
class SplitModule:
    """One module of an application as the SLO split sees it: its request rate and the configurations it may run
    in (model_repository_gen.app_manifest.AppModule is the served module)."""

    name: str
    rate: float
    configs: tuple[Config, ...]


@dataclass(frozen=True)
class AppGraph:
    """Modules in a topological order, edges (upstream, downstream), the end-to-end SLO."""

    name: str
    modules: tuple[SplitModule, ...]
    edges: tuple[tuple[str, str], ...]
    slo: float

    @functools.cached_property
    def paths(self) -> list[tuple[str, ...]]:
        """Every source-to-sink path, as module names (found once: the splits ask for them in their loops)."""
        nxt: dict[str, list[str]] = {m.name: [] for m in self.modules}
        for a, b in self.edges:
            nxt[a].append(b)
        sources = [m.name for m in self.modules if all(b != m.name for _, b in self.edges)]

        def walk(n: str) -> list[tuple[str, ...]]:
            return [(n,) + rest for d in nxt[n] for rest in walk(d)] if nxt[n] else [(n,)]
        return [p for s in sources for p in walk(s)]

    def latency(self, budgets: Mapping[str, float]) -> float:
        """The end-to-end latency: the longest path's sum of budgets."""
        return max(sum(budgets[n] for n in p) for p in self.paths)


@dataclass(frozen=True)
class Split:
    """Each module's budget and its schedule within it."""

    method: str
    budgets: dict[str, float]
    schedules: dict[str, ModuleSchedule]

    @property
    def cost(self) -> float:
        return sum(s.cost for s in self.schedules.values())


def _schedule(m: SplitModule, budget: float) -> ModuleSchedule | None:
    """The cheapest of the module scheduler's schedules at budgets up to ``budget`` (Algorithm 1 only moves
    forward through the configurations, so a larger budget can strand a residual a smaller one serves: what
    meets a tighter budget meets this one too)."""
    within = [b for b, _ in cost_steps(m) if b <= budget + _EPS]
    return schedule_module(m.rate, within[-1], m.configs) if within else None


def _least_budget(m: SplitModule) -> float:
    steps = cost_steps(m)
    return steps[0][0] if steps else math.inf


def finish(app: AppGraph, method: str, budgets: Mapping[str, float]) -> Split:
    """Schedule every module within its budget, the slack spread; a module that cannot meet it is an error."""
    budgets, schedules = spread_slack(app, budgets), {}
    for m in app.modules:
        s = _schedule(m, budgets[m.name])
        if s is None:
            raise InputError(f"application {app.name}: the {method} split leaves module {m.name} "
                             f"{budgets[m.name] * 1e3:.1f} ms, and no schedule serves its {m.rate:.4g} req/s within "
                             f"it (it needs {_least_budget(m) * 1e3:.1f} ms); raise the application's SLO")
        schedules[m.name] = s
    return Split(method, dict(budgets), schedules)


def split_uniform(app: AppGraph) -> Split:
    depth = max(len(p) for p in app.paths)
    return finish(app, "uniform", {m.name: app.slo / depth for m in app.modules})


def split_harpagon(app: AppGraph) -> Split:
    """Algorithm 2 over each module's configuration sets (the module scheduler's schedules at its cost steps),
    from the costliest, fastest one: repeatedly move the module whose next set saves the most cost per unit of
    latency it adds (LC) while every path stays within the SLO."""
    steps = {m.name: cost_steps(m) for m in app.modules}
    need = {n: (s[0][0] if s else math.inf) for n, s in steps.items()}
    if app.latency(need) > app.slo + _EPS:
        raise InputError(f"application {app.name}: even each module's fastest schedule needs "
                         f"{app.latency(need) * 1e3:.1f} ms end to end, over its SLO of {app.slo * 1e3:.1f} ms")
    cur = {n: 0 for n in steps}
    while True:
        lat = {n: steps[n][k][0] for n, k in cur.items()}
        best: tuple[float, str, int] | None = None
        for n, s in steps.items():
            b0, c0 = s[cur[n]]
            for k in range(cur[n] + 1, len(s)):
                lc = (c0 - s[k][1]) / (s[k][0] - b0)
                if (best is None or lc > best[0]) and app.latency(lat | {n: s[k][0]}) <= app.slo + _EPS:
                    best = (lc, n, k)
        if best is None:
            return finish(app, "harpagon", lat)
        cur[best[1]] = best[2]


def spread_slack(app: AppGraph, budgets: Mapping[str, float]) -> dict[str, float]:
    """Harpagon's latency reassigner: slack that no path needs goes to the modules (in topological order, each
    taking what every path through it leaves), so the budgets handed on fill the SLO on every critical path."""
    out, paths = dict(budgets), app.paths
    for m in app.modules:
        out[m.name] += max(0.0, app.slo - max(sum(out[n] for n in p) for p in paths if m.name in p))
    return out


@functools.lru_cache(maxsize=256)
def cost_steps(m: SplitModule) -> list[tuple[float, float]]:
    """(budget, cost) at each budget where the module scheduler's cost reaches a new low: the budgets d + b / w
    at which some check of Algorithm 1 flips, for every rate w the algorithm meets at them, searched until no new
    one appears. Between two consecutive such budgets every check has the same outcome, so the budgets kept
    are all a split needs to consider."""
    rates: set[float] = {m.rate}
    done: set[float] = set()
    while len(done) < MAX_STEPS:
        todo = sorted({c.duration + c.batch / w for c in m.configs for w in rates} - done)[:MAX_STEPS - len(done)]
        if not todo:
            break
        for b in todo:
            schedule_module(m.rate, b, m.configs, seen=rates)
        done.update(todo)
    steps, last = [], math.inf
    for b in sorted(done):
        s = schedule_module(m.rate, b, m.configs)
        if s is not None and s.cost < last - _EPS:
            steps.append((b, s.cost))
            last = s.cost
    return steps


def split_optimal(app: AppGraph, time_limit_s: float | None = 60.0) -> Split:
    """The least-cost split: one binary per (module, cost step), one step per module, every path's budgets
    within the SLO (HiGHS, to a zero gap)."""
    steps = {m.name: [(b, c) for b, c in cost_steps(m) if b <= app.slo + _EPS] for m in app.modules}
    empty = [n for n, s in steps.items() if not s]
    if empty:
        raise InputError(f"application {app.name}: module(s) {', '.join(empty)} cannot meet any budget within "
                         f"the SLO of {app.slo * 1e3:.1f} ms")
    cols = [(n, b, c) for n, s in steps.items() for b, c in s]
    rows_lo, rows_hi, a_row, a_col, a_val = [], [], [], [], []
    for k, m in enumerate(app.modules):  # one step per module
        for j, (n, _, _) in enumerate(cols):
            if n == m.name:
                a_row.append(k), a_col.append(j), a_val.append(1.0)
        rows_lo.append(1.0), rows_hi.append(1.0)
    for p in app.paths:  # every path within the SLO
        r = len(rows_lo)
        for j, (n, b, _) in enumerate(cols):
            if n in p:
                a_row.append(r), a_col.append(j), a_val.append(b)
        rows_lo.append(-np.inf), rows_hi.append(app.slo + _EPS)
    arrays = MilpArrays(np.array([c for _, _, c in cols]), np.zeros(len(cols)), np.ones(len(cols)),
                        np.ones(len(cols), bool), np.array(a_row), np.array(a_col), np.array(a_val, float),
                        np.array(rows_lo), np.array(rows_hi), maximize=False)
    res = solve_milp(arrays, "highs", time_limit_s, 0.0)
    if res.x is None:
        raise InputError(f"application {app.name}: no split of its SLO of {app.slo * 1e3:.1f} ms lets every "
                         f"module meet its budget ({res.status})")
    return finish(app, "optimal", {n: b for (n, b, _), x in zip(cols, res.x) if x > 0.5})


def split(app: AppGraph, method: str) -> Split:
    if method not in SPLITS:
        raise InputError(f"SLO split {method!r}: choose one of {', '.join(SPLITS)}")
    return {"harpagon": split_harpagon, "optimal": split_optimal, "uniform": split_uniform}[method](app)
