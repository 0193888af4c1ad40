"""KServe v2 / Triton datatypes and the tensor spec that manifests, configs and the sidecar share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Triton datatype strings (KServe v2) of the tensors poolpipe moves.
DATATYPES = ("FP32", "FP16", "FP64", "INT64", "INT32", "INT8", "UINT8", "BOOL")
# Bytes per element of every fixed-size KServe v2 datatype.
DTYPE_SIZE = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2, "INT32": 4,
              "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8, "BF16": 2}


def element_count(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # Triton datatype, e.g. "FP32"
    shape: tuple[int, ...]  # without the batch dimension

    def bytes_per_request(self) -> int:
        return DTYPE_SIZE[self.datatype] * element_count(self.shape)
