"""What a spec is planned for, beside the spec itself: ``PlanRequest`` (what ``poolpipe plan``'s flags say).

Checked when made: one-line InputErrors that name the ``poolpipe plan`` flag. plan.json records it as ``request``
(``to_dict``), so that a re-planner plans the same way (``request_of``); a plan.json without one gets the
defaults, with the planner and solver the plan names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from planner.apps.harpagon_split import SPLITS
from planner.objectives import OBJECTIVES
from planner.planners import DEFAULT_TIME_LIMIT_S, PLANNERS, check_limits, check_planner
from planner.sizing.paris import check_pdf
from planner.solvers.milp_solvers import DEFAULT_REL_GAP, SOLVERS, SolverOptions
from planner.sustained.evaluators import NO_EVALUATOR, known_evaluators
from plans.arrivals import parse_arrivals
from plans.plan_json import Plan
from poolpipe_common.documents import check_fields
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import DEFAULT_OVERHEADS, Overheads

# plan.json's ``request`` fields (progress and jobs are how to plan, not what)
RECORDED = ("planner", "objective", "rates_rps", "prices", "colocate", "app_split", "paris_batch_pdf", "arrivals",
            "overheads", "evaluator", "solver", "time_limit_s", "gap", "verify")


@dataclass(frozen=True)
class PlanRequest:
    """The planner and objective, their inputs (rates, prices, batch-size PDF), and the solver's limits."""

    planner: str = "ppipe"  # a name of planner.planners.PLANNERS
    objective: str = "sustained"  # a name of planner.objectives.OBJECTIVES
    rates_rps: Mapping[str, float] | None = None  # objective cost: the req/s each model must sustain at >= 99 %
    prices: Mapping[str, float] | None = None  # per GPU-hour by GPU type: objective cost, and application splits
    colocate: bool = False  # vGPUs of different (model, partition) pairs may share a GPU (as the spec's colocate)
    app_split: str = "harpagon"  # how each application's SLO is split into module budgets (planner.apps)
    paris_batch_pdf: Mapping[int, float] | None = None  # PARIS instance sizing for this batch-size PDF
    arrivals: str = "poisson"  # what a plan must sustain: poisson | bursty:CV | replay:NAME_OR_FILE
    overheads: Overheads | None = None  # per-stage costs of serving (serve --overheads-out); None: DEFAULT_OVERHEADS
    evaluator: str | None = None  # what measures sustainable rates (planner.sustained.evaluators); None: the best
    solver: str = "highs"
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S  # None: no limit
    gap: float = DEFAULT_REL_GAP
    progress: bool = False  # show the solver's log
    jobs: int | None = None  # processes that measure candidate plans at once; None: one per core (how, not what)
    verify: bool = False  # objective throughput: measure the plan's sustainable rates (the others always measure)

    def __post_init__(self) -> None:
        check_planner(self.planner)
        if self.objective not in OBJECTIVES:
            raise InputError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.app_split not in SPLITS:
            raise InputError(f"unknown --app-split {self.app_split!r}; choose one of {', '.join(SPLITS)}")
        if not isinstance(self.colocate, bool):
            raise InputError(f"colocate must be true or false, got {self.colocate!r}")
        self._check_cost_inputs()
        if self.paris_batch_pdf is not None:
            check_pdf(self.paris_batch_pdf)
            if self.objective == "cost" or self.planner != "ppipe":
                raise InputError("--paris needs --batch-pdf (and goes with the default planner, and with the "
                                 "sustained or throughput objective)")
        parse_arrivals(self.arrivals)
        if self.overheads is not None and not isinstance(self.overheads, Overheads):
            raise InputError(f"overheads must be an overheads document (--overheads FILE), got {self.overheads!r}")
        if self.evaluator is not None and self.evaluator not in known_evaluators():
            raise InputError(f"unknown evaluator {self.evaluator!r}; choose one of {', '.join(known_evaluators())}")
        check_limits(self.solver, self.time_limit_s, self.gap)
        if not isinstance(self.verify, bool):
            raise InputError(f"verify must be true or false, got {self.verify!r}")
        if self.verify and self.evaluator == NO_EVALUATOR:
            raise InputError("--verify measures the plan with an evaluator: drop --evaluator none")
        if self.jobs is not None and (not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs < 1):
            raise InputError(f"--jobs: expected a whole number >= 1 (processes that measure plans), got {self.jobs!r}")

    def _check_cost_inputs(self) -> None:
        if self.objective == "cost" and (not self.rates_rps or not self.prices):
            raise InputError("--objective cost needs --rate NAME=REQ_PER_S,... and --price TYPE=PER_GPU_HOUR,...")
        if self.objective != "cost" and self.rates_rps:
            raise InputError("--rate and --price go with --objective cost (--price also with a spec's applications)")
        for flag, m in (("--rate", self.rates_rps), ("--price", self.prices)):
            if m is not None and (not isinstance(m, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    for k, v in m.items())):
                raise InputError(f"{flag}: expected NAME=NUMBER pairs, got {m!r}")

    def solver_options(self) -> SolverOptions:
        """The validated solver options, with the log when ``progress``."""
        opts = check_limits(self.solver, self.time_limit_s, self.gap)
        return SolverOptions(opts.solver, opts.time_limit_s, opts.rel_gap, self.progress)

    def costs(self) -> Overheads:
        """The per-stage costs of serving that plans are made and measured with."""
        return self.overheads or DEFAULT_OVERHEADS

    def to_dict(self) -> dict[str, Any]:
        """plan.json's ``request`` object (the batch-size PDF's keys as strings, as JSON has them)."""
        d: dict[str, Any] = {k: getattr(self, k) for k in RECORDED}
        d["overheads"] = None if self.overheads is None else self.overheads.to_dict()
        for k in ("rates_rps", "prices"):
            d[k] = None if d[k] is None else dict(d[k])
        pdf = self.paris_batch_pdf
        d["paris_batch_pdf"] = None if pdf is None else {str(b): p for b, p in pdf.items()}
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "plan.json: request", **given: Any) -> PlanRequest:
        """The request plan.json recorded (missing fields: defaults), with ``given`` fields instead of its own."""
        check_fields(d, RECORDED, where)
        raw = {**d, **given}
        pdf = raw.get("paris_batch_pdf")
        if isinstance(pdf, Mapping):
            try:
                raw["paris_batch_pdf"] = {int(b): p for b, p in pdf.items()}
            except ValueError:
                raise InputError(f"{where}: paris_batch_pdf: batch sizes must be whole numbers, got {pdf!r}") from None
        if isinstance(raw.get("overheads"), Mapping):
            try:
                raw["overheads"] = Overheads.from_dict(dict(raw["overheads"]), f"{where}: overheads")
            except ValueError as e:
                raise InputError(str(e)) from None
        return cls(**{f.name: raw[f.name] for f in fields(cls) if f.name in raw})


def request_of(plan: Plan, **given: Any) -> PlanRequest:
    """How ``plan`` was planned (its ``request``; a plan without one: the defaults, with its planner and solver
    where they are registered ones), with ``given`` fields instead."""
    if plan.request is not None:
        return PlanRequest.from_dict(plan.request, **given)
    known = {"planner": plan.planner} if plan.planner in PLANNERS else {}
    known.update({"solver": plan.solver} if plan.solver in SOLVERS else {})
    return PlanRequest.from_dict({}, **{**known, **given})
