"""Tensors of a model served only by emulated hosts, invented from its profile (no ONNX file needed).

A profile may know only byte sizes (the PPipe reference profiles in data/ppipe). The emulated model
then gets one tensor per place bytes cross, each 1-D with the profiled size x ``scale``:

- the model's input: named after the profile's input tensor when it has exactly one (else ``input``),
  FP32 of ``input_bytes`` (UINT8 when not a multiple of 4); without ``input_bytes`` the default
  image tensor ``input`` FP32 [3, 224, 224] (both sides scaled by sqrt(scale));
- the boundary after block c-1 (cut c): ``boundary<c>``, FP32 of the profiled bytes (UINT8 when not a
  multiple of 4; FP16 of half the bytes with fp16 boundaries, as a cast would send it);
- the model's output: ``output``, FP32 of the last block's ``output_bytes``, else ``[1000]`` (logits).

Every tensor keeps at least 4 elements (the emulated device's checksum). ``scale`` (0 < scale <= 1)
shrinks what moves for machines that cannot move the real sizes; the plan's NIC times stay as profiled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec
from profiling.profile import Profile

DEFAULT_INPUT = TensorSpec("input", "FP32", (3, 224, 224))
DEFAULT_OUTPUT = TensorSpec("output", "FP32", (1000,))
MIN_ELEMENTS = 4


def check_scale(scale: float) -> float:
    """``--emulated-tensor-scale`` must be a number in (0, 1]."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise InputError(f"--emulated-tensor-scale {scale!r}: must be > 0 and <= 1 (1 = the profiled sizes)")
    return float(scale)


def _flat(name: str, nbytes: int, scale: float, fp16: bool = False) -> TensorSpec:
    """One 1-D tensor of about ``nbytes * scale`` bytes (FP16: as an FP32 tensor of that size cast to FP16)."""
    if fp16:
        return TensorSpec(name, "FP16", (max(MIN_ELEMENTS, round(nbytes * scale / 4)),))
    if nbytes % 4 == 0:
        return TensorSpec(name, "FP32", (max(MIN_ELEMENTS, round(nbytes * scale / 4)),))
    return TensorSpec(name, "UINT8", (max(MIN_ELEMENTS, round(nbytes * scale)),))


@dataclass(frozen=True)
class EmulatedTensors:
    """The invented inputs, outputs and boundary tensors (cut -> tensor) of one emulated model."""

    model: str
    num_blocks: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    boundaries: dict[int, TensorSpec]  # only cuts whose size the profile knows

    def _boundary(self, cut: int) -> list[TensorSpec]:
        if cut not in self.boundaries:
            raise InputError(f"profile {self.model}: the boundary after block {cut - 1} has no byte size, so an "
                             "emulated model cannot invent its tensor; give --onnx or a profile with output_bytes")
        return [self.boundaries[cut]]

    def stage_io(self, first: int, end: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """Inputs and outputs of the partition of blocks [first, end)."""
        ins = list(self.inputs) if first == 0 else self._boundary(first)
        outs = list(self.outputs) if end == self.num_blocks else self._boundary(end)
        return ins, outs


def emulated_tensors(profile: Profile, scale: float = 1.0, fp16_boundaries: bool = False) -> EmulatedTensors:
    """Tensors of ``profile``'s model for an emulated deployment (see the module docstring)."""
    scale = check_scale(scale)
    names = profile.input_tensors or ()
    in_name = names[0] if len(names) == 1 else DEFAULT_INPUT.name
    if profile.input_bytes:
        model_in = _flat(in_name, profile.input_bytes, scale)
    else:
        c, h, w = DEFAULT_INPUT.shape
        f = math.sqrt(scale)
        model_in = TensorSpec(in_name, DEFAULT_INPUT.datatype, (c, max(2, round(h * f)), max(2, round(w * f))))
    boundaries = {cut: _flat(f"boundary{cut}", nbytes, scale, fp16_boundaries)
                  for cut in range(1, profile.num_blocks) if (nbytes := profile.blocks[cut - 1].output_bytes)}
    last = profile.blocks[-1].output_bytes
    model_out = _flat(DEFAULT_OUTPUT.name, last, scale) if last else \
        TensorSpec(DEFAULT_OUTPUT.name, DEFAULT_OUTPUT.datatype, (max(MIN_ELEMENTS, round(1000 * scale)),))
    if model_in.name in {t.name for t in (*boundaries.values(), model_out)}:
        model_in = TensorSpec(DEFAULT_INPUT.name + "_0", model_in.datatype, model_in.shape)
    return EmulatedTensors(profile.model, profile.num_blocks, (model_in,), (model_out,), boundaries)
