"""Applications in a planning spec: DAGs of the spec's models with one end-to-end SLO (Harpagon's sessions).

YAML::

    applications:
      - name: traffic
        slo_us: 400000                 # end to end, from the app request to its last module's answer
        rate_rps: 50                   # app requests per second
        modules:                       # each runs one of the spec's models
          - {name: det, model: atss_r101_fpn_1x_coco}
          - {name: cls, model: googlenet-v3-pytorch}
        edges:
          - {from: det, to: cls, fan_out: 4, tensors: {crops: x}}   # 4 cls requests per det request

One module has no incoming edge (the source); a module's rate is the app's times the fan-outs on its way (the
largest, where several edges lead to it). ``tensors`` (upstream output -> downstream input) is passed on to the
plan's ``applications`` for ``generate``, which checks it against the models' real tensors.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from poolpipe_common.documents import as_float, as_str, check_fields, need
from poolpipe_common.errors import InputError

APP_FIELDS = ("name", "slo_us", "rate_rps", "modules", "edges")
MODULE_FIELDS = ("name", "model")
EDGE_FIELDS = ("from", "to", "fan_out", "tensors")


@dataclass(frozen=True)
class AppEdgeSpec:
    src: str
    dst: str
    fan_out: float
    tensors: dict[str, str] | None = None


@dataclass(frozen=True)
class AppSpec:
    """One application: modules (name, model) in a topological order, the source first; its edges."""

    name: str
    slo_us: float
    rate_rps: float
    modules: tuple[tuple[str, str], ...]
    edges: tuple[AppEdgeSpec, ...]

    def rates(self) -> dict[str, float]:
        """Requests per second each module gets: the app's rate times the fan-outs on the way to it."""
        out: dict[str, float] = {}
        for name, _ in self.modules:
            ins = [out[e.src] * e.fan_out for e in self.edges if e.dst == name]
            out[name] = max(ins) if ins else self.rate_rps
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "slo_us": self.slo_us, "rate_rps": self.rate_rps,
                "modules": [{"name": n, "model": m} for n, m in self.modules],
                "edges": [{"from": e.src, "to": e.dst, "fan_out": e.fan_out,
                           **({"tensors": dict(e.tensors)} if e.tensors is not None else {})} for e in self.edges]}


def _positive(d: Any, key: str, where: str) -> float:
    x = as_float(need(d, key, where), f"{where}.{key}")
    if not x > 0:
        raise InputError(f"{where}.{key}: must be > 0, got {x!r}")
    return x


def parse_edge(e: Any, names: Collection[str], w: str, fields: Sequence[str] = EDGE_FIELDS) -> AppEdgeSpec:
    """One application edge (the spec's, or plan.json's and manifest.json's, which allow more ``fields``):
    both ends modules of the application, no self-edge, a positive fan-out (default 1), tensors optional."""
    check_fields(e, fields, w)
    src, dst = as_str(need(e, "from", w), f"{w}.from"), as_str(need(e, "to", w), f"{w}.to")
    for end, n in (("from", src), ("to", dst)):
        if n not in names:
            raise InputError(f"{w}.{end}: {n!r} is not a module of the application ({', '.join(names)})")
    if src == dst:
        raise InputError(f"{w}: an edge from module {src!r} to itself")
    fan_out = as_float(e.get("fan_out", 1.0), f"{w}.fan_out")
    if not fan_out > 0:
        raise InputError(f"{w}.fan_out: must be > 0 (requests to {dst!r} per request of {src!r}), got {fan_out!r}")
    tensors = e.get("tensors")
    if tensors is not None and (not isinstance(tensors, dict) or not tensors
                                or not all(isinstance(k, str) and isinstance(v, str) for k, v in tensors.items())):
        raise InputError(f"{w}.tensors: expected an object of {src!r} output -> {dst!r} input names")
    return AppEdgeSpec(src, dst, fan_out, tensors)


def topological_order(names: Sequence[str], edges: Sequence[tuple[str, str]], where: str) -> list[str]:
    """``names`` ordered so every (upstream, downstream) edge points forward, from the one source module;
    errors for several sources or a cycle."""
    sources = [n for n in names if not any(b == n for _, b in edges)]
    if len(sources) != 1:
        raise InputError(f"{where}: the application needs exactly one source module (one without incoming edges) "
                         f"to take its inputs; it has {len(sources)}: {', '.join(sources) or 'none (a cycle)'}")
    order, left = [], list(names)
    while left:
        ready = [n for n in left if all(a in order for a, b in edges if b == n)]
        if not ready:
            raise InputError(f"{where}: the edges between modules {', '.join(left)} form a cycle")
        order += ready
        left = [n for n in left if n not in ready]
    return order


def app_from_dict(d: Any, models: Sequence[str], w: str) -> AppSpec:
    check_fields(d, APP_FIELDS, w)
    name = as_str(need(d, "name", w), f"{w}.name")
    raw_mods = need(d, "modules", w)
    if not isinstance(raw_mods, list) or not raw_mods:
        raise InputError(f"{w}.modules: expected a non-empty list of {{name, model}}")
    mods = []
    for k, m in enumerate(raw_mods):
        check_fields(m, MODULE_FIELDS, f"{w}.modules[{k}]")
        mname = as_str(need(m, "name", f"{w}.modules[{k}]"), f"{w}.modules[{k}].name")
        model = as_str(m.get("model", mname), f"{w}.modules[{k}].model")
        if model not in models:
            raise InputError(f"{w}.modules[{k}].model: {model!r} is not one of the spec's models "
                             f"({', '.join(models)}); add it under models: with its profile")
        mods.append((mname, model))
    names = [n for n, _ in mods]
    if len(set(names)) != len(names):
        raise InputError(f"{w}.modules: a module name appears twice ({', '.join(names)})")
    raw_edges = d.get("edges", [])
    if not isinstance(raw_edges, list):
        raise InputError(f"{w}.edges: expected a list of {{from, to, fan_out, tensors}}")
    edges = tuple(parse_edge(e, names, f"{w}.edges[{k}]") for k, e in enumerate(raw_edges))
    order = topological_order(names, [(e.src, e.dst) for e in edges], w)
    return AppSpec(name, _positive(d, "slo_us", w), _positive(d, "rate_rps", w),
                   tuple((n, dict(mods)[n]) for n in order), edges)


def apps_from_list(raw: Any, models: Sequence[str], where: str = "spec") -> tuple[AppSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"{where}: applications: expected a list of applications")
    apps = tuple(app_from_dict(a, models, f"{where}: applications[{k}]") for k, a in enumerate(raw))
    refuse_twice([a.name for a in apps], where)
    return apps


def refuse_twice(app_names: Sequence[str], where: str) -> None:
    """An application name declared twice is an error (the spec's and the plan's lists alike)."""
    dup = next((n for n in app_names if list(app_names).count(n) > 1), None)
    if dup is not None:
        raise InputError(f"{where}: applications: {dup!r} is declared twice")
