"""Cut points of an ONNX graph: places in a topological order where only a few activations cross.

Nodes are put in a stable topological order (the file's order when it is already sorted). Cut
position ``k`` splits them into ``order[:k]`` and ``order[k:]``; the tensors *crossing* it are the
activations produced before ``k`` (or graph inputs) that are used at or after ``k`` (or are graph
outputs). Initializers and constants (Constant nodes and anything computed only from constants)
never cross: the Extractor copies them into whichever partition uses them. A residual connection
keeps its input alive until its Add, so positions inside a residual block have two crossing
tensors and are not single-tensor cut points.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import onnx

from poolpipe_common.errors import InputError
from profiling.onnx_graph import graph_inputs, initializer_names


@dataclass(frozen=True)
class CutPoint:
    position: int               # number of (non-constant) nodes before the cut in GraphCuts.order
    tensors: tuple[str, ...]    # activation tensors crossing the cut, sorted by producer


@dataclass(frozen=True)
class Segment:
    """Nodes between two consecutive cuts, with the tensors entering and leaving."""

    index: int
    start: int
    end: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class GraphCuts:
    order: tuple[str, ...]            # names of the non-constant nodes in topological order
    inputs: tuple[str, ...]           # graph inputs (not initializers)
    outputs: tuple[str, ...]          # graph outputs
    cuts: tuple[CutPoint, ...]

    def segments(self) -> list[Segment]:
        """The segments between consecutive cut points (one segment if there are no cuts)."""
        bounds = [(0, self.inputs), *((c.position, c.tensors) for c in self.cuts), (len(self.order), self.outputs)]
        return [Segment(i, a[0], b[0], a[1], b[1]) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def _subgraph_refs(node: onnx.NodeProto) -> set[str]:
    """Outer-scope tensors used inside a node's subgraphs (If/Loop/Scan bodies)."""
    refs: set[str] = set()
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            local = {i.name for i in g.input} | initializer_names(g)
            for n in g.node:
                refs.update(t for t in [*n.input, *_subgraph_refs(n)] if t and t not in local)
                local.update(n.output)
    return refs


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads, including those its subgraphs read from the outer scope."""
    return [t for t in node.input if t] + sorted(_subgraph_refs(node) - set(node.input))


def topological_order(graph: onnx.GraphProto) -> list[int]:
    """Node indices in a topological order that keeps the file's order wherever it can (stable Kahn)."""
    producer = {t: i for i, n in enumerate(graph.node) for t in n.output if t}
    deps = [{producer[t] for t in node_inputs(n) if t in producer and producer[t] != i}
            for i, n in enumerate(graph.node)]
    users: list[list[int]] = [[] for _ in graph.node]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    missing = [len(d) for d in deps]
    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(graph.node):
        raise InputError(f"graph {graph.name!r} has a cycle; it is not a valid ONNX graph")
    return order


def constant_tensors(graph: onnx.GraphProto, order: list[int]) -> set[str]:
    """Initializers plus outputs of nodes that read only constants (Constant, shape arithmetic on weights)."""
    const = initializer_names(graph)
    for i in order:
        n = graph.node[i]
        if all(t in const for t in node_inputs(n)):
            const.update(t for t in n.output if t)
    return const


# Element-wise activations that runtimes fuse into the op before them: a cut between the two is valid
# but costs that fusion, so by default it is not offered.
FUSED_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
                               "Elu", "Selu", "Softplus", "Mish", "Gelu"})


def find_cut_points(model: onnx.ModelProto, max_tensors: int = 1, split_activations: bool = False) -> GraphCuts:
    """All positions where between 1 and ``max_tensors`` activations cross (none of them a graph input).

    Unless ``split_activations``, positions that would separate an op from the element-wise
    activation that alone consumes its output are skipped.
    """
    g = model.graph
    topo = topological_order(g)
    const = constant_tensors(g, topo)
    order = [i for i in topo if not all(t in const for t in g.node[i].output if t)]
    inputs = graph_inputs(g)
    outputs = [o.name for o in g.output]
    n = len(order)
    produced_at = {t: -1 for t in inputs}
    last_use = {t: -1 for t in inputs}
    uses: dict[str, int] = {}
    for k, i in enumerate(order):
        for t in node_inputs(g.node[i]):
            if t not in const:
                last_use[t] = k
                uses[t] = uses.get(t, 0) + 1
        for t in g.node[i].output:
            if t:
                produced_at[t] = k
                last_use.setdefault(t, -1)
    for t in outputs:
        last_use[t] = n
    # sweep: tensor t crosses position k iff produced_at[t] < k <= last_use[t]
    starts: dict[int, list[str]] = {}
    for t, p in produced_at.items():
        if last_use[t] > p:
            starts.setdefault(p + 1, []).append(t)
    live: dict[str, None] = {}
    cuts: list[CutPoint] = []
    input_set = set(inputs)
    for k in range(n):
        for t in starts.get(k, []):
            live[t] = None
        for t in [t for t in live if last_use[t] < k]:
            del live[t]
        if k == 0 or not 1 <= len(live) <= max_tensors or input_set.intersection(live):
            continue
        tensors = tuple(sorted(live, key=lambda t: produced_at[t]))
        nxt = g.node[order[k]]
        if (not split_activations and len(tensors) == 1 and nxt.op_type in FUSED_ACTIVATIONS
                and nxt.input[0] == tensors[0] and uses.get(tensors[0]) == 1 and tensors[0] not in outputs):
            continue
        if cuts and cuts[-1].tensors == tensors:  # only dead nodes in between: same cut
            continue
        cuts.append(CutPoint(k, tensors))
    names = tuple(g.node[i].name or f"{g.node[i].op_type}_{i}" for i in order)
    return GraphCuts(names, tuple(inputs), tuple(outputs), tuple(cuts))
