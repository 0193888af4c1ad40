"""A set of real inputs to profile a variable-latency model with (``profile measure --inputs FILE.npz``).

The file holds one array per model input, named as the input, with the samples along the first axis and each
sample shaped as the model takes it without its batch dimension. The profiler times every block over batches
drawn from these samples in turn, so the recorded latency quantiles span the inputs as well as the repeats.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from poolpipe_common.errors import InputError
from profiling.onnx_graph import TensorSpec


def load_input_set(path: Path, specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """The samples of ``path`` per model input, checked against ``specs`` (one-line InputErrors)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise InputError(f"--inputs {path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputError(f"--inputs {path}: not a NumPy .npz file ({e}); write one with "
                         f"numpy.savez(path, **{{input_name: samples}})") from None
    if not arrays:
        raise InputError(f"--inputs {path}: no arrays; it needs one per model input "
                         f"({', '.join(s.name for s in specs)})")
    names = {s.name for s in specs}
    missing = [s.name for s in specs if s.name not in arrays]
    extra = sorted(set(arrays) - names)
    if missing or extra:
        raise InputError(f"--inputs {path}: arrays {sorted(arrays)} do not match the model's inputs "
                         f"{sorted(names)}" + (f" (missing {', '.join(missing)})" if missing else "")
                         + (f" (unknown {', '.join(extra)})" if extra else ""))
    counts = set()
    for s in specs:
        a = arrays[s.name]
        if a.dtype != s.dtype:
            raise InputError(f"--inputs {path}: {s.name} is {a.dtype}, the model takes {s.dtype} "
                             "; convert it with .astype")
        if a.ndim != len(s.shape) + 1 or tuple(a.shape[1:]) != tuple(s.shape):
            raise InputError(f"--inputs {path}: {s.name} has shape {list(a.shape)}; expected "
                             f"[samples, {', '.join(map(str, s.shape))}] (samples first, no batch dimension)")
        counts.add(a.shape[0])
    if len(counts) != 1:
        raise InputError(f"--inputs {path}: the inputs hold different numbers of samples ({sorted(counts)}); "
                         "give every input the same number")
    if counts == {0}:
        raise InputError(f"--inputs {path}: no samples (first axis 0)")
    return {s.name: np.ascontiguousarray(arrays[s.name]) for s in specs}


def input_batches(samples: dict[str, np.ndarray], batch: int) -> list[dict[str, np.ndarray]]:
    """Batches of ``batch`` samples that together cover every sample once (the last wraps around)."""
    n = len(next(iter(samples.values())))
    groups = -(-n // batch)
    return [{k: v[[(g * batch + i) % n for i in range(batch)]] for k, v in samples.items()} for g in range(groups)]
