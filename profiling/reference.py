"""Importer for the PPipe reference data (data/ppipe): measured block timings and boundary sizes as Profiles.

The layout is described in data/ppipe/README.md: block-timing/MODEL-GPU-V.csv (10 blocks x batch
sizes 1..8/V, µs), boundary-bytes/MODEL.csv (9 boundaries, bytes at batch 1) and
reference-plans.json (the published Gurobi plans with the terms they were solved on).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np

from poolpipe_common.errors import InputError
from profiling.profile import FORMAT, Block, DeviceTiming, Profile

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT / "data" / "ppipe"
_TIMING = re.compile(r"^(?P<model>.+)-(?P<gpu>[A-Za-z0-9]+)-(?P<v>\d+)\.csv$")


def _read_rows(path: Path) -> list[list[float]]:
    try:
        with path.open(newline="") as f:
            return [[float(x) for x in row] for row in csv.reader(f) if row]
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"{path}: not a numeric CSV ({e})") from None


def reference_models(ref_dir: str | Path = REFERENCE_DIR) -> list[str]:
    """Model names that have boundary sizes in the reference layout."""
    return sorted(p.stem for p in (Path(ref_dir) / "boundary-bytes").glob("*.csv"))


def import_ppipe_profile(ref_dir: str | Path, model: str) -> Profile:
    """Convert one model of the reference layout into a Profile named after the model."""
    ref = Path(ref_dir)
    bb_path = ref / "boundary-bytes" / f"{model}.csv"
    if not bb_path.is_file():
        known = ", ".join(reference_models(ref)) or "none"
        raise InputError(f"no boundary sizes for model {model!r} in {ref}/boundary-bytes (models: {known})")
    boundary = [int(r[0]) for r in _read_rows(bb_path)]
    timings: dict[str, dict[int, DeviceTiming]] = {}
    for f in sorted((ref / "block-timing").glob(f"{model}-*.csv")):
        m = _TIMING.match(f.name)
        if not m or m["model"] != model:
            continue  # another model whose name starts with this one
        rows = _read_rows(f)
        if len(rows) != len(boundary) + 1:
            raise InputError(f"{f}: {len(rows)} blocks, but {bb_path} has {len(boundary)} boundaries")
        width = {len(r) for r in rows}
        if len(width) != 1:
            raise InputError(f"{f}: rows have different numbers of batch sizes")
        n = width.pop()
        timings.setdefault(m["gpu"], {})[int(m["v"])] = DeviceTiming(tuple(range(1, n + 1)), np.array(rows))
    if not timings:
        raise InputError(f"no block timings for model {model!r} in {ref}/block-timing")
    blocks = tuple(Block(f"block{i}", boundary[i] if i < len(boundary) else None) for i in range(len(boundary) + 1))
    return Profile(model, blocks, timings, None, None,
                   {"source": "PPipe public artifact (data/ppipe)", "engine": "TensorRT TF32",
                    "method": "MPS split into V vGPUs, all V running at once", "format": FORMAT})
