"""Merge profiles of one model measured on different device types into one profile."""

from __future__ import annotations

from typing import Any

from poolpipe_common.errors import InputError
from profiling.profile import Profile


def _first_block_mismatch(a: Profile, b: Profile) -> str | None:
    """A description of the first difference between the blocks of ``a`` and ``b``, or None."""
    if a.num_blocks != b.num_blocks:
        return f"{a.num_blocks} blocks vs {b.num_blocks} blocks"
    if a.input_tensors and b.input_tensors and a.input_tensors != b.input_tensors:
        return f"input_tensors {list(a.input_tensors)} vs {list(b.input_tensors)}"
    for i, (x, y) in enumerate(zip(a.blocks, b.blocks)):
        if x.output_tensors and y.output_tensors and x.output_tensors != y.output_tensors:
            return f"blocks[{i}].output_tensors {list(x.output_tensors)} vs {list(y.output_tensors)}"
        if x.output_bytes is not None and y.output_bytes is not None and x.output_bytes != y.output_bytes:
            return f"blocks[{i}].output_bytes {x.output_bytes} vs {y.output_bytes}"
    if a.input_bytes is not None and b.input_bytes is not None and a.input_bytes != b.input_bytes:
        return f"input_bytes {a.input_bytes} vs {b.input_bytes}"
    return None


def merge_profiles(named: list[tuple[str, Profile]]) -> Profile:
    """One profile holding every device type of ``named`` ((source, profile) pairs); blocks must match."""
    if len(named) < 2:
        raise InputError("profile merge needs at least two profiles")
    (src0, base), rest = named[0], named[1:]
    timings = dict(base.timings)
    owner = {d: src0 for d in base.timings}
    dev_prov: dict[str, Any] = dict(base.provenance.get("devices") or {d: base.provenance for d in base.timings})
    for src, p in rest:
        if p.model != base.model:
            raise InputError(f"{src}: model {p.model!r} differs from {base.model!r} in {src0}; "
                             "merge profiles of one model")
        diff = _first_block_mismatch(base, p)
        if diff:
            raise InputError(f"{src}: blocks differ from {src0}: {diff}; measure it with "
                             f"'poolpipe profile measure --like {src0}'")
        for d, levels in p.timings.items():
            if d in timings:
                raise InputError(f"{src}: device type {d!r} is also in {owner[d]}; measure one of them with "
                                 "another --label")
            timings[d], owner[d] = levels, src
            dev_prov[d] = (p.provenance.get("devices") or {}).get(d, p.provenance)
    # tensor names and sizes: take them from whichever profile has them
    blocks = tuple(next((q.blocks[i] for _, q in named if q.blocks[i].output_tensors), base.blocks[i])
                   for i in range(base.num_blocks))
    input_tensors = next((q.input_tensors for _, q in named if q.input_tensors), None)
    input_bytes = next((q.input_bytes for _, q in named if q.input_bytes is not None), None)
    prov = {"source": "poolpipe profile merge", "merged_from": [s for s, _ in named],
            "model_sha256": sorted({str(q.provenance["model_sha256"]) for _, q in named
                                    if "model_sha256" in q.provenance}),
            "devices": dev_prov}
    memory = next((q.memory for _, q in named if q.memory is not None), None)
    interference = {d: m for _, q in named for d, m in q.interference.items()}
    return Profile(base.model, blocks, timings, input_bytes, input_tensors, prov, memory, interference)
