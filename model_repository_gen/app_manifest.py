"""Application DAGs in manifest.json: the plan's ``applications`` (models chained by edges with a tensor mapping and a
fan-out) checked against the planned models' real tensors, with what serving needs derived once: the app's inputs
(its one source module's inputs), its outputs (every sink module's outputs), and how many rows each module gets per
row of an app request.

Fan-out: an edge whose upstream tensor has shape [N, *S] per request, feeding a downstream input of shape S, hands
the downstream module N rows per upstream row (``rows``; the plan's ``fan_out`` is the planner's expectation of N,
kept as it is). A sink reached with R > 1 rows per app row answers with shape [R, *S] per app row. Output names are
the sink model's tensor names, or ``<module>.<tensor>`` for every output whose name two sinks share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from plans.spec.applications import parse_edge, refuse_twice, topological_order
from poolpipe_common.documents import as_float, as_str, check_fields, need
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec

APP_FIELDS = ("name", "slo_us", "rate_rps", "modules", "edges", "inputs", "outputs", "max_batch_size",
              "split")  # split: how the planner split the SLO (planner.apps.app_plan), for the reader; not used here
MODULE_FIELDS = ("name", "model", "slo_us", "rate_rps", "rows", "dummy_requests")
EDGE_FIELDS = ("from", "to", "fan_out", "tensors", "rows")


class ModelTensors(Protocol):
    """What an app needs of a planned model (manifest.ModelInfo has it)."""

    name: str
    slo_us: float
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class AppModule:
    name: str
    model: str
    slo_us: float  # this module's share of the app's SLO
    rate_rps: float
    rows: int  # rows this module runs per row of an app request (product of the fan-outs on its way)
    # the plan assumes full batches here (Harpagon's dummy requests): the sidecar pads every batch of this module's
    # model to its pipeline's planned batch with zero rows, whose outputs are dropped
    dummy_requests: bool = False


@dataclass(frozen=True)
class AppEdge:
    src: str
    dst: str
    fan_out: float  # the plan's expected N
    rows: int  # N given by the tensors' shapes
    tensors: tuple[tuple[str, str], ...]  # (upstream output, downstream input)


@dataclass(frozen=True)
class AppTensor:
    """An app-facing tensor: ``spec`` (app name, shape per app row) is module ``module``'s tensor ``tensor``."""

    spec: TensorSpec
    module: str
    tensor: str


@dataclass(frozen=True)
class ApplicationInfo:
    name: str
    slo_us: float
    rate_rps: float
    max_batch_size: int  # the source model's
    modules: tuple[AppModule, ...]  # in a topological order (the source first)
    edges: tuple[AppEdge, ...]
    inputs: tuple[AppTensor, ...]
    outputs: tuple[AppTensor, ...]

    def module(self, name: str) -> AppModule:
        return next(m for m in self.modules if m.name == name)

    def incoming(self, module: str) -> tuple[AppEdge, ...]:
        return tuple(e for e in self.edges if e.dst == module)

    def after_us(self, module: str) -> float:
        """The SLO shares the modules after ``module`` need on the longest path to a sink: its deadline is the
        app's deadline less this."""
        nxt = [e.dst for e in self.edges if e.src == module]
        return max((self.module(n).slo_us + self.after_us(n) for n in nxt), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        def tensors(ts: tuple[AppTensor, ...]) -> list[dict[str, Any]]:
            return [{"name": t.spec.name, "datatype": t.spec.datatype, "shape": list(t.spec.shape),
                     "module": t.module, "tensor": t.tensor} for t in ts]
        return {"name": self.name, "slo_us": self.slo_us, "rate_rps": self.rate_rps,
                "max_batch_size": self.max_batch_size,
                "modules": [{"name": m.name, "model": m.model, "slo_us": m.slo_us, "rate_rps": m.rate_rps,
                             "rows": m.rows, "dummy_requests": m.dummy_requests} for m in self.modules],
                "edges": [{"from": e.src, "to": e.dst, "fan_out": e.fan_out, "rows": e.rows,
                           "tensors": dict(e.tensors)} for e in self.edges],
                "inputs": tensors(self.inputs), "outputs": tensors(self.outputs)}


def _edge(e: Any, modules: Mapping[str, Any], models: Mapping[str, ModelTensors], w: str) -> AppEdge:
    edge = parse_edge(e, list(modules), w, EDGE_FIELDS)  # the planner's checks, then the tensors' own
    src, dst, raw = edge.src, edge.dst, edge.tensors
    if raw is None:
        raise InputError(f"{w}: missing field 'tensors'")
    up, down = models[modules[src]], models[modules[dst]]
    outs, ins = {t.name: t for t in up.outputs}, {t.name: t for t in down.inputs}
    rows: set[int] = set()
    for o, i in raw.items():
        if o not in outs:
            raise InputError(f"{w}.tensors: {o!r} is not an output of model {up.name!r} ({', '.join(outs)})")
        if i not in ins:
            raise InputError(f"{w}.tensors.{o}: {i!r} is not an input of model {down.name!r} ({', '.join(ins)})")
        a, b = outs[o], ins[i]
        if a.datatype != b.datatype:
            raise InputError(f"{w}.tensors.{o}: {up.name}.{o} is {a.datatype} but {down.name}.{i} is {b.datatype}")
        if a.shape == b.shape:
            rows.add(1)
        elif a.shape[1:] == b.shape:
            rows.add(a.shape[0])
        else:
            raise InputError(f"{w}.tensors.{o}: shape {list(a.shape)} of {up.name}.{o} does not fit {list(b.shape)} "
                             f"of {down.name}.{i} (equal, or [N, *that] for N rows each)")
    if len(rows) > 1:
        raise InputError(f"{w}.tensors: the tensors give {dst!r} different numbers of rows {sorted(rows)}")
    return AppEdge(src, dst, edge.fan_out, rows.pop(), tuple((o, i) for o, i in raw.items()))


def _module_rows(order: list[str], edges: list[AppEdge], w: str) -> dict[str, int]:
    rows = {order[0]: 1}
    for n in order[1:]:
        got = {rows[e.src] * e.rows for e in edges if e.dst == n}
        if len(got) > 1:
            raise InputError(f"{w}: module {n!r} would get different numbers of rows per app row {sorted(got)} "
                             "from its incoming edges")
        rows[n] = got.pop()
    return rows


def _check_fed(order: list[str], modules: Mapping[str, str], edges: list[AppEdge],
               models: Mapping[str, ModelTensors], w: str) -> None:
    """Every input of every module but the source is fed by exactly one edge tensor."""
    for n in order[1:]:
        fed = [i for e in edges if e.dst == n for _, i in e.tensors]
        for t in models[modules[n]].inputs:
            if fed.count(t.name) != 1:
                raise InputError(f"{w}: input {t.name!r} of module {n!r} is fed by {fed.count(t.name)} edge "
                                 "tensors (expected exactly one)")


def _outputs(order: list[str], modules: Mapping[str, str], edges: list[AppEdge], rows: Mapping[str, int],
             models: Mapping[str, ModelTensors]) -> tuple[AppTensor, ...]:
    sinks = [n for n in order if not any(e.src == n for e in edges)]
    names = [t.name for s in sinks for t in models[modules[s]].outputs]
    out = []
    for s in sinks:
        for t in models[modules[s]].outputs:
            name = f"{s}.{t.name}" if names.count(t.name) > 1 else t.name
            shape = (rows[s], *t.shape) if rows[s] > 1 else t.shape
            out.append(AppTensor(TensorSpec(name, t.datatype, shape), s, t.name))
    return tuple(out)


def application_from_dict(a: Any, models: Mapping[str, ModelTensors], w: str) -> ApplicationInfo:
    """One application (plan.json's form, or manifest.json's with its derived fields, which are derived again)."""
    check_fields(a, APP_FIELDS, w)
    name = as_str(need(a, "name", w), f"{w}.name")
    if name in models:
        raise InputError(f"{w}.name: {name!r} is already a planned model's name; an application needs its own")
    slo = as_float(need(a, "slo_us", w), f"{w}.slo_us", 0)
    rate = as_float(a.get("rate_rps", 0.0), f"{w}.rate_rps", 0)
    raw_modules = need(a, "modules", w)
    if not isinstance(raw_modules, list) or not raw_modules:
        raise InputError(f"{w}.modules: expected a non-empty list of {{name, model}}")
    modules: dict[str, str] = {}
    raw_by_name: dict[str, dict] = {}
    for k, m in enumerate(raw_modules):
        wm = f"{w}.modules[{k}]"
        check_fields(m, MODULE_FIELDS, wm)
        mn, model = as_str(need(m, "name", wm), f"{wm}.name"), as_str(need(m, "model", wm), f"{wm}.model")
        if mn in modules:
            raise InputError(f"{wm}.name: module {mn!r} is declared twice")
        if model not in models:
            raise InputError(f"{wm}.model: {model!r} is not a model of the plan ({', '.join(models)})")
        modules[mn], raw_by_name[mn] = model, m
    raw_edges = a.get("edges") or []
    if not isinstance(raw_edges, list):
        raise InputError(f"{w}.edges: expected a list of {{from, to, fan_out, tensors}}")
    edges = [_edge(e, modules, models, f"{w}.edges[{k}]") for k, e in enumerate(raw_edges)]
    order = topological_order(list(modules), [(e.src, e.dst) for e in edges], w)
    rows = _module_rows(order, edges, w)
    _check_fed(order, modules, edges, models, w)
    mods = []
    for n in order:
        m, wm = raw_by_name[n], f"{w}.modules[{list(modules).index(n)}]"
        mods.append(AppModule(n, modules[n], as_float(m.get("slo_us", models[modules[n]].slo_us), f"{wm}.slo_us", 0),
                              as_float(m.get("rate_rps", rate * rows[n]), f"{wm}.rate_rps", 0), rows[n],
                              _flag(m.get("dummy_requests", False), f"{wm}.dummy_requests")))
    source = models[modules[order[0]]]
    inputs = tuple(AppTensor(t, order[0], t.name) for t in source.inputs)
    return ApplicationInfo(name, slo, rate, source.max_batch_size, tuple(mods), tuple(edges), inputs,
                           _outputs(order, modules, edges, rows, models))


def _flag(x: Any, where: str) -> bool:
    if not isinstance(x, bool):
        raise InputError(f"{where}: expected true or false, got {x!r}")
    return x


def padded_models(apps: Sequence[ApplicationInfo]) -> frozenset[str]:
    """Models whose batches the sidecar pads to the planned batch: some app's plan assumes dummy requests there."""
    return frozenset(m.model for a in apps for m in a.modules if m.dummy_requests)


def applications_from_list(raw: Sequence[Any], models: Mapping[str, ModelTensors], where: str
                           ) -> tuple[ApplicationInfo, ...]:
    apps = tuple(application_from_dict(a, models, f"{where}: applications[{k}]") for k, a in enumerate(raw))
    refuse_twice([a.name for a in apps], where)
    return apps
