"""Request payloads built from a model's metadata, so one Locust user works against any model."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype


def random_tensor(datatype: str, shape: list[int], rng: np.random.RandomState) -> np.ndarray:
    """Deterministic data of a Triton datatype; dynamic dimensions (-1) become 1 (a batch of one)."""
    dims = [1 if d < 0 else d for d in shape]
    dtype = triton_to_np_dtype(datatype)
    if dtype is None or datatype == "BYTES":
        raise ValueError(f"loadtest cannot synthesise {datatype} inputs")
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(dims).astype(dtype)
    if dtype == np.bool_:
        return rng.randint(0, 2, dims).astype(np.bool_)
    return rng.randint(0, 100, dims).astype(dtype)


def request_inputs(metadata: dict[str, Any], seed: int = 0) -> list[grpcclient.InferInput]:
    """One request's inputs for a model, from ``get_model_metadata(..., as_json=True)``."""
    rng = np.random.RandomState(seed)
    inputs = []
    for t in metadata["inputs"]:
        shape = [int(d) for d in t["shape"]]
        data = random_tensor(t["datatype"], shape, rng)
        inp = grpcclient.InferInput(t["name"], list(data.shape), t["datatype"])
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    return inputs
