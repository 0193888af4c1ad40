"""Planning a spec's applications: split each app's SLO across its modules (planner.apps.harpagon_split) on the
models' whole-model profiles, plan every model under its modules' budgets, and hand the plan its
``applications`` list (module budgets, rates, where the schedule counts on dummy requests) for ``generate``.

A module's configurations are (GPU type, MPS level, batch) of its model's profile: the whole model's latency there,
and a price of the GPU type's price / level (a vGPU at level V is 1/V of a GPU; prices default to 1 per GPU, so
costs read in GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from planner.apps.harpagon_module import Config
from planner.apps.harpagon_split import AppGraph, Split, SplitModule, split
from plans.spec.applications import AppSpec
from plans.spec.planning_spec import ClusterSpec, PlanningSpec
from poolpipe_common.errors import InputError
from profiling.profile import Profile


def module_configs(profile: Profile, cluster: ClusterSpec, prices: Mapping[str, float]) -> tuple[Config, ...]:
    """Every (GPU type, MPS level, batch) the cluster offers and the profile measured, as one configuration."""
    out = []
    for t in cluster.gpu_types:
        for v in range(1, cluster.vgpu_levels.get(t, 1) + 1):
            if v not in profile.timings.get(t, {}):
                continue
            for b in profile.batch_sizes(t, v):
                out.append(Config(b, profile.latency_us(t, v, b) / 1e6, prices.get(t, 1.0) / v,
                                  t if v == 1 else f"{t}/{v}"))
    return tuple(out)


def app_graph(app: AppSpec, spec: PlanningSpec, prices: Mapping[str, float]) -> AppGraph:
    profiles = {m.name: m.profile for m in spec.models}
    rates = app.rates()
    modules = tuple(SplitModule(n, rates[n], module_configs(profiles[model], spec.cluster, prices))
                    for n, model in app.modules)
    return AppGraph(app.name, modules, tuple((e.src, e.dst) for e in app.edges), app.slo_us / 1e6)


@dataclass(frozen=True)
class AppPlan:
    """One application's split, with the uniform split's cost beside it for the report."""

    app: AppSpec
    split: Split
    uniform_cost: float | None  # None where the uniform split cannot meet the SLO

    def to_plan_dict(self) -> dict[str, Any]:
        """The plan.json ``applications`` entry (model_repository_gen.app_manifest reads it)."""
        d = self.app.to_dict()
        rates = self.app.rates()
        d["modules"] = [{"name": n, "model": m, "slo_us": round(self.split.budgets[n] * 1e6, 3),
                         "rate_rps": rates[n], "dummy_requests": self.split.schedules[n].dummy_rate > 0}
                        for n, m in self.app.modules]
        d["split"] = {"method": self.split.method, "cost": self.split.cost, "uniform_cost": self.uniform_cost,
                      "schedules": {n: s.describe() for n, s in self.split.schedules.items()}}
        return d

    def lines(self) -> list[str]:
        uni = "uniform split infeasible" if self.uniform_cost is None else f"uniform split {self.uniform_cost:.3g}"
        out = [f"application {self.app.name}: SLO {self.app.slo_us / 1e3:.1f} ms split by {self.split.method}, "
               f"cost {self.split.cost:.3g} ({uni})"]
        rates = self.app.rates()
        for n, model in self.app.modules:
            out.append(f"  {n} ({model}): {self.split.budgets[n] * 1e3:.1f} ms at "
                       f"{rates[n]:.4g} req/s: {self.split.schedules[n].describe()}")
        return out


def plan_applications(spec: PlanningSpec, method: str = "harpagon", prices: Mapping[str, float] | None = None
                      ) -> tuple[AppPlan, ...]:
    out = []
    for app in spec.applications:
        g = app_graph(app, spec, prices or {})
        try:
            uniform: float | None = split(g, "uniform").cost
        except InputError:  # the uniform split cannot meet the SLO; the report says so
            uniform = None
        out.append(AppPlan(app, split(g, method), uniform))
    return tuple(out)


def spec_under_budgets(spec: PlanningSpec, apps: tuple[AppPlan, ...]) -> PlanningSpec:
    """The spec with each model's SLO lowered to the smallest budget a module running it was given."""
    budget: dict[str, float] = {}
    for a in apps:
        for n, model in a.app.modules:
            budget[model] = min(budget.get(model, float("inf")), a.split.budgets[n] * 1e6)
    return replace(spec, models=tuple(replace(m, slo_us=min(m.slo_us, budget.get(m.name, m.slo_us)))
                                      for m in spec.models))
