"""What one stage's call to a tritonserver carries: the boundary tensors between stages, the request built
from them, the raw outputs of its response and the measured timing (the live executor's wire format)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from model_repository_gen.manifest import StageInfo
from model_repository_gen.triton_config import TIMING_OUTPUTS
from poolpipe_common.tensors import TensorSpec
from scheduler.server.planned.shm_pool import Region, align
from scheduler.server.planned.stage_parameters import Value, set_grpc_parameter


def wall_ns_to_mono_us(ns: float) -> float:
    return ns / 1e3 - (time.time() - time.monotonic()) * 1e6


@dataclass
class HopTensor:
    """A boundary tensor between stages: its raw bytes in the sidecar (rows back to back, as Triton sends them:
    stacked, sliced and forwarded without a numpy round trip), or a region of a machine's pool."""

    spec: TensorSpec
    shape: list[int]
    data: bytes | None = None
    region: Region | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.spec.bytes_per_request() * self.shape[0]


@dataclass(frozen=True)
class StageTiming:
    """When (µs, monotonic) a stage's input was at hand, sent, computed and answered."""

    ready_us: float
    send_us: float
    start_us: float
    end_us: float
    recv_us: float

    @property
    def compute_us(self) -> tuple[float, float]:
        return self.start_us, self.end_us


class StageFault(Exception):
    """A stage call to ``vgpu`` that failed, in gRPC's status terms whichever protocol carried it."""

    def __init__(self, vgpu: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{vgpu}: {code.name}: {details}")
        self.vgpu, self.code, self.details = vgpu, code, details


def stacked(rows: list[Any], pad_bytes: int = 0) -> bytes:
    """The rows' bytes back to back (one copy; a row is any contiguous buffer), and ``pad_bytes`` zero bytes after
    them: the dummy requests of a padded batch (every stage carries them, the answers skip them: only the first
    len(live) rows of an output are given out)."""
    data = rows[0] if len(rows) == 1 and isinstance(rows[0], bytes) else b"".join(rows)
    return data + bytes(pad_bytes) if pad_bytes else data


def row_of(outputs: dict[str, tuple[bytes, int]], i: int) -> dict[str, bytes]:
    """Row ``i`` of a batch's outputs (name -> (the batch's raw bytes, bytes per row)), as bytes per name."""
    return {n: data[i * rb:(i + 1) * rb] for n, (data, rb) in outputs.items()}


def output_offsets(stage: StageInfo, out_region: Region | None, batch: int) -> dict[str, int]:
    """Where each boundary output of a ``batch`` goes in ``out_region`` (aligned, back to back); {} without one."""
    if out_region is None:
        return {}
    offsets, off = {}, 0
    for spec in stage.outputs:
        offsets[spec.name] = off
        off += align(spec.bytes_per_request() * batch)
    return offsets


def infer_request(stage: StageInfo, inputs: list[HopTensor], out_region: Region | None, batch: int,
                   request_id: str, parameters: Mapping[str, Value] | None = None
                   ) -> tuple[service_pb2.ModelInferRequest, dict[str, int]]:
    """The stage's ModelInferRequest: inputs as bytes or shm references, outputs (to shm where given), the
    compute timestamps and the batch's request ``parameters`` (stage_parameters.py); returns it with each shm
    output's offset."""
    req = service_pb2.ModelInferRequest(model_name=stage.triton_model, id=request_id)
    for key, value in (parameters or {}).items():
        set_grpc_parameter(req.parameters, key, value)
    for spec, h in zip(stage.inputs, inputs):
        t = req.inputs.add(name=spec.name, datatype=spec.datatype, shape=h.shape)
        if h.region is not None:
            t.parameters["shared_memory_region"].string_param = h.region.name
            t.parameters["shared_memory_byte_size"].int64_param = h.nbytes
            t.parameters["shared_memory_offset"].int64_param = h.offset
        else:
            req.raw_input_contents.append(h.data)  # type: ignore[arg-type]
    offsets = output_offsets(stage, out_region, batch)
    for spec in stage.outputs:
        o = req.outputs.add(name=spec.name)
        if out_region is not None:
            o.parameters["shared_memory_region"].string_param = out_region.name
            o.parameters["shared_memory_byte_size"].int64_param = spec.bytes_per_request() * batch
            o.parameters["shared_memory_offset"].int64_param = offsets[spec.name]
    for n in TIMING_OUTPUTS:
        req.outputs.add(name=n)
    return req, offsets


def raw_outputs(resp: service_pb2.ModelInferResponse, in_shm: set[str]) -> dict[str, tuple[list[int], bytes]]:
    """name -> (shape, raw bytes); outputs written to shared memory have shape and empty bytes."""
    aligned = len(resp.raw_output_contents) == len(resp.outputs)
    out, j = {}, 0
    for i, o in enumerate(resp.outputs):
        if aligned:
            data = resp.raw_output_contents[i]
        elif o.name in in_shm:
            data = b""
        else:
            data = resp.raw_output_contents[j] if j < len(resp.raw_output_contents) else b""
            j += 1
        out[o.name] = (list(o.shape), data)
    return out
