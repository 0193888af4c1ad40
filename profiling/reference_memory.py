"""Estimated block memory for the PPipe reference profiles (data/ppipe), which record latencies and boundary
sizes but not weights: each model's published parameter count (approximate, FP32 as TensorRT TF32 keeps
weights) spread over its 10 blocks in proportion to their batch-1 latency, and each block's activations per
request taken as the boundary tensors it reads and writes. Good enough for a memory constraint and a
bandwidth proxy; a measured profile (``poolpipe profile measure``) records the real numbers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from poolpipe_common.errors import InputError
from profiling.block_memory import BlockMemory
from profiling.profile import Profile

PARAMS_MILLIONS = {  # approximate parameter counts of the reference models (model cards / papers)
    "apcnet_r101-d8_4xb2-40k_cityscapes-512x1024": 75.0,
    "atss_r101_fpn_1x_coco": 51.0,
    "centernet-update_r50-caffe_fpn_ms-1x_coco": 32.0,
    "colorization-v2": 32.0,
    "convnext_large": 198.0,
    "dnl_r101-d8_4xb2-40k_cityscapes-512x1024": 69.0,
    "fsaf_r101_fpn_1x_coco": 55.0,
    "gcnet_r101-d8_4xb2-40k_cityscapes-512x1024": 69.0,
    "googlenet-v3-pytorch": 23.8,
    "nonlocal_r101-d8_4xb2-40k_cityscapes-512x1024": 69.0,
    "repvgg-b3": 110.9,
    "tf_efficientdet_d1": 6.6,
}


def with_estimated_memory(profile: Profile) -> Profile:
    """The reference profile with estimated ``memory`` (see the module docstring)."""
    if profile.model not in PARAMS_MILLIONS:
        raise InputError(f"no parameter count for {profile.model!r} (known: {', '.join(sorted(PARAMS_MILLIONS))})")
    dev = next(d for d in profile.timings if 1 in profile.timings[d])
    t = profile.timings[dev][1]
    lat = np.maximum(t.column(t.batch_sizes[0]), 1.0)
    weights = PARAMS_MILLIONS[profile.model] * 1e6 * 4 * lat / lat.sum()
    outs = [b.output_bytes or 0 for b in profile.blocks]
    ins = [profile.input_bytes or outs[0], *outs[:-1]]
    mem = BlockMemory(tuple(int(w) for w in weights), tuple(int(a + b) for a, b in zip(ins, outs)),
                      "estimated: published parameter count spread by block latency; boundary tensors in + out")
    return replace(profile, memory=mem)
