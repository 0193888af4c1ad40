"""One sparse MILP in array form, solved by HiGHS (highspy), CBC (PuLP) or Gurobi (gurobipy).

The planner builds its model once as numpy arrays (COO constraint matrix, bounds, integrality) and
hands it to a solver here: HiGHS gets it through ``passModel`` directly; CBC and Gurobi read the
same model from an MPS file that HiGHS writes, so all three solve exactly the same problem.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from poolpipe_common.errors import InputError

SOLVERS = ("highs", "cbc", "gurobi")
DEFAULT_REL_GAP = 1e-4  # the published planner ran Gurobi with this relative gap
# HiGHS 1.16 solves the root LP of these models through a presolved IPM fallback whose singleton-column
# stuffing is quadratic: 1-2 s for a 700-row model that takes 10 ms as a plain LP. With presolve at the
# root only that path is skipped (40x faster on models proven at the root) but sub-MIP heuristics lose
# presolve (2-3x slower on models that need a search). So a first pass runs that way, bounded by work (nodes and
# improving solutions), not by seconds: a pass cut by the clock would give a slower machine another incumbent, and the
# passes after it another plan. HiGHS's search is deterministic for a given model and options.
QUICK_PASS_NODES = 200


@dataclass(frozen=True)
class MilpArrays:
    """max/min cost @ x  s.t.  row_lower <= A x <= row_upper, lower <= x <= upper, some x integer."""

    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integer: np.ndarray  # bool per column
    a_row: np.ndarray
    a_col: np.ndarray
    a_val: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    maximize: bool = True

    @property
    def num_cols(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)


@dataclass(frozen=True)
class SolverOptions:
    """How to solve: which solver, for how long (None: no limit), to which relative gap, with its log or not."""

    solver: str = "highs"
    time_limit_s: float | None = None
    rel_gap: float = DEFAULT_REL_GAP
    log: bool = False
    # A bound on work, not on time (HiGHS's branch-and-bound nodes per solve; None: none): a solve stopped by it
    # ends at the same point on any machine. Other solvers ignore it.
    max_nodes: int | None = None

    def remaining(self, spent_s: float) -> SolverOptions:
        """The options for the next step of a solve that has run ``spent_s``: the same limit while any is left (a
        millisecond once it is spent, so no step starts). Never the wall-clock remainder: HiGHS's search depends on
        the limit's exact value, so a remainder made the same MILP give different plans on a busier machine."""
        if self.time_limit_s is None or spent_s < self.time_limit_s:
            return self
        return replace(self, time_limit_s=1e-3)


@dataclass(frozen=True)
class MilpResult:
    """A solve's outcome: the incumbent (x, objective), the proven bound on the optimum, and their gap."""

    # optimal (within the gap) | time_limit, node_limit (feasible, not proven; stopped by the clock or by max_nodes)
    # | infeasible | no_solution
    status: str
    x: np.ndarray | None
    objective: float | None
    seconds: float
    gap: float | None = None  # |objective - bound| / |objective|
    bound: float | None = None  # best bound on the optimum (>= objective when maximising)


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """The relative MIP gap as HiGHS defines it: |bound - objective| / max(|objective|, tiny)."""
    if objective is None or bound is None or not np.isfinite(bound):
        return None
    return abs(bound - objective) / max(abs(objective), 1e-9)


def _highs_model(m: MilpArrays, names: bool = False):
    import highspy

    order = np.lexsort((m.a_row, m.a_col))
    cols, rows, vals = m.a_col[order], m.a_row[order], m.a_val[order]
    start = np.searchsorted(cols, np.arange(m.num_cols + 1))
    lp = highspy.HighsLp()
    lp.num_col_ = m.num_cols
    lp.num_row_ = m.num_rows
    lp.col_cost_ = np.asarray(m.cost, float)
    lp.col_lower_ = np.asarray(m.lower, float)
    lp.col_upper_ = np.asarray(m.upper, float)
    lp.row_lower_ = np.asarray(m.row_lower, float)
    lp.row_upper_ = np.asarray(m.row_upper, float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start.astype(np.int32)
    lp.a_matrix_.index_ = rows.astype(np.int32)
    lp.a_matrix_.value_ = vals.astype(float)
    lp.sense_ = highspy.ObjSense.kMaximize if m.maximize else highspy.ObjSense.kMinimize
    if names:
        lp.col_names_ = [f"x{i}" for i in range(m.num_cols)]
        lp.row_names_ = [f"r{i}" for i in range(m.num_rows)]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)  # HiGHS fixes its thread pool per process: every solve asks for the same
    h.passModel(lp)
    idx = np.flatnonzero(m.integer).astype(np.int32)
    if len(idx):
        h.changeColsIntegrality(len(idx), idx, np.full(len(idx), highspy.HighsVarType.kInteger.value, np.uint8))
    return h


def _set_start(h, m: MilpArrays, start: np.ndarray) -> None:
    """Hand HiGHS a feasible point to start from (integers rounded; HiGHS checks it and ignores a bad one)."""
    import highspy

    x = np.where(m.integer, np.rint(start), start)
    sol = highspy.HighsSolution()
    sol.col_value = list(np.clip(x, m.lower, m.upper))
    sol.value_valid = True
    h.setSolution(sol)


def _solve_highs(m: MilpArrays, time_limit_s: float | None, rel_gap: float, log: bool,
                 start: np.ndarray | None = None, quick: bool = False, max_nodes: int | None = None) -> MilpResult:
    """One HiGHS search (single-threaded, so the same model gives the same answer on any machine that finishes it
    within its time limit)."""
    h = _highs_model(m)
    if quick:  # see QUICK_PASS_NODES
        h.setOptionValue("mip_root_presolve_only", True)
        h.setOptionValue("mip_max_nodes", QUICK_PASS_NODES)
    elif max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    h.setOptionValue("output_flag", log)
    h.setOptionValue("mip_rel_gap", rel_gap)
    h.setOptionValue("threads", 1)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    if start is not None:
        _set_start(h, m, start)
    t = time.perf_counter()
    h.run()
    return _highs_result(h, m, time.perf_counter() - t)


def _highs_result(h: Any, m: MilpArrays, secs: float) -> MilpResult:
    """What a finished (or interrupted) HiGHS instance holds."""
    import highspy

    st = h.getModelStatus()
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if st == highspy.HighsModelStatus.kOptimal:
        status = "optimal"
    elif st == highspy.HighsModelStatus.kInfeasible:
        return MilpResult("infeasible", None, None, secs)
    elif has_sol:
        status = "node_limit" if st == highspy.HighsModelStatus.kSolutionLimit else "time_limit"
    else:
        return MilpResult("no_solution", None, None, secs, bound=_finite(info.mip_dual_bound))
    x = np.asarray(h.getSolution().col_value)
    obj = float(info.objective_function_value)
    bound = float(info.mip_dual_bound) if m.integer.any() else obj
    if status == "optimal" and not np.isfinite(bound):
        bound = obj
    return MilpResult(status, x, obj, secs, relative_gap(obj, bound), bound)


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def is_feasible(m: MilpArrays, x: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether ``x`` satisfies the bounds, rows and integrality of ``m`` (absolute tolerance ``tol``)."""
    if len(x) != m.num_cols or np.any(x < m.lower - tol) or np.any(x > m.upper + tol):
        return False
    if np.any(np.abs(x[m.integer] - np.rint(x[m.integer])) > tol):
        return False
    ax = np.bincount(m.a_row, m.a_val * x[m.a_col], minlength=m.num_rows)
    return bool(np.all(ax >= m.row_lower - tol) and np.all(ax <= m.row_upper + tol))


def solve_lp(m: MilpArrays) -> tuple[float, np.ndarray] | None:
    """An LP (integrality ignored) by HiGHS: its optimum and row duals, or None without an optimum."""
    import highspy

    h = _highs_model(MilpArrays(m.cost, m.lower, m.upper, np.zeros(m.num_cols, bool), m.a_row, m.a_col,
                                m.a_val, m.row_lower, m.row_upper, m.maximize))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value), np.asarray(h.getSolution().row_dual)


def _write_mps(m: MilpArrays, path: Path) -> None:
    """MPS as a minimisation with named columns x0.. so that other solvers read it unambiguously."""
    neg = MilpArrays(-m.cost if m.maximize else m.cost, m.lower, m.upper, m.integer, m.a_row, m.a_col,
                     m.a_val, m.row_lower, m.row_upper, maximize=False)
    h = _highs_model(neg, names=True)
    h.writeModel(str(path))


def _pulp_problem(m: MilpArrays):
    """The same model through PuLP's API (one expression per row, built from the sorted COO arrays)."""
    import pulp

    prob = pulp.LpProblem("poolpipe", pulp.LpMaximize if m.maximize else pulp.LpMinimize)
    xs = [prob.add_variable(f"x{i}", None if not np.isfinite(lo) else float(lo),
                            None if not np.isfinite(up) else float(up), pulp.LpInteger if isint else pulp.LpContinuous)
          for i, (lo, up, isint) in enumerate(zip(m.lower, m.upper, m.integer))]
    nz = np.flatnonzero(m.cost)
    prob += pulp.LpAffineExpression([(xs[i], float(m.cost[i])) for i in nz])
    order = np.argsort(m.a_row, kind="stable")
    bounds = np.searchsorted(m.a_row[order], np.arange(m.num_rows + 1))
    for r in range(m.num_rows):
        sl = order[bounds[r]:bounds[r + 1]]
        expr = pulp.LpAffineExpression([(xs[j], float(v)) for j, v in zip(m.a_col[sl], m.a_val[sl])])
        if np.isfinite(m.row_upper[r]):
            prob += expr <= float(m.row_upper[r])
        if np.isfinite(m.row_lower[r]):
            prob += expr >= float(m.row_lower[r])
    return prob, xs


def _solve_cbc(m: MilpArrays, time_limit_s: float | None, rel_gap: float, log: bool,
               start: np.ndarray | None = None) -> MilpResult:
    import pulp

    prob, xs = _pulp_problem(m)
    with warnings.catch_warnings():  # PuLP 3 flags its bundled CBC for PuLP 4; it is the CBC it ships
        warnings.simplefilter("ignore", DeprecationWarning)
        cmd = pulp.PULP_CBC_CMD(msg=log, timeLimit=time_limit_s, gapRel=rel_gap, threads=1)
    t = time.perf_counter()
    prob.solve(cmd)
    secs = time.perf_counter() - t
    status = pulp.LpStatus[prob.status]
    sol_status = getattr(prob, "sol_status", None)
    if status == "Infeasible":
        return MilpResult("infeasible", None, None, secs)
    if status != "Optimal" and sol_status != pulp.LpSolutionIntegerFeasible:
        return MilpResult("no_solution", None, None, secs)
    x = np.array([v.value() or 0.0 for v in xs])
    proven = status == "Optimal" and sol_status != pulp.LpSolutionIntegerFeasible
    obj = float(m.cost @ x)
    bound = obj if proven else None  # PuLP does not report CBC's bound
    return MilpResult("optimal" if proven else "time_limit", x, obj, secs, 0.0 if proven else None, bound)


def _solve_gurobi(m: MilpArrays, time_limit_s: float | None, rel_gap: float, log: bool,
                  start: np.ndarray | None = None) -> MilpResult:
    try:
        import gurobipy as gp
    except ImportError:
        raise InputError("--solver gurobi needs the gurobipy package and a Gurobi license "
                         "(pip install gurobipy); or use --solver highs (default) or cbc") from None
    with tempfile.TemporaryDirectory(prefix="poolpipe-grb-") as d:
        path = Path(d) / "model.mps"
        _write_mps(m, path)
        try:
            env = gp.Env(empty=True)
            env.setParam("OutputFlag", int(log))
            env.start()
            model = gp.read(str(path), env=env)
        except gp.GurobiError as e:
            raise InputError(f"--solver gurobi: Gurobi is not usable here ({e}); "
                             "install a license or use --solver highs") from None
    model.Params.MIPGap = rel_gap
    if time_limit_s is not None:
        model.Params.TimeLimit = float(time_limit_s)
    t = time.perf_counter()
    try:
        model.optimize()
    except gp.GurobiError as e:
        raise InputError(f"--solver gurobi failed: {e} (a size-limited license cannot solve this model; "
                         "use --solver highs)") from None
    secs = time.perf_counter() - t
    if model.Status == gp.GRB.INFEASIBLE:
        return MilpResult("infeasible", None, None, secs)
    if model.SolCount == 0:
        return MilpResult("no_solution", None, None, secs)
    x = np.array([v.X for v in sorted(model.getVars(), key=lambda v: int(v.VarName[1:]))])
    status = "optimal" if model.Status == gp.GRB.OPTIMAL else "time_limit"
    bound = float(model.ObjBound) * (-1.0 if m.maximize else 1.0)  # the MPS is a minimisation
    return MilpResult(status, x, float(m.cost @ x), secs, float(model.MIPGap), bound)


def solve_with(m: MilpArrays, opts: SolverOptions, start: np.ndarray | None = None, quick: bool = False
               ) -> MilpResult:
    """:func:`solve_milp` under ``opts`` (its solver, time limit, gap, log and node limit)."""
    return solve_milp(m, opts.solver, opts.time_limit_s, opts.rel_gap, opts.log, start, quick, opts.max_nodes)


def solve_milp(m: MilpArrays, solver: str = "highs", time_limit_s: float | None = None,
               rel_gap: float = DEFAULT_REL_GAP, log: bool = False, start: np.ndarray | None = None,
               quick: bool = False, max_nodes: int | None = None) -> MilpResult:
    """Solve ``m`` with the named solver, from the feasible point ``start`` if given (HiGHS only);
    ``quick``: HiGHS's presolve at the root only (see QUICK_PASS_NODES); ``max_nodes``: SolverOptions.max_nodes.
    Bad solver names and unusable solvers raise InputError."""
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit_s}")
    if not 0 <= rel_gap < 1:
        raise InputError(f"--gap must be a relative MIP gap in [0, 1), got {rel_gap}")
    if solver == "highs":
        return _solve_highs(m, time_limit_s, rel_gap, log, start, quick, max_nodes)
    fn = {"cbc": _solve_cbc, "gurobi": _solve_gurobi}[solver]
    return fn(m, time_limit_s, rel_gap, log, start)
