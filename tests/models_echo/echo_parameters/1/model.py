"""Answers each request's parameters (Triton's JSON of them) as one string."""

import os
import sys

# The backend stub ignores PYTHONPATH for its own sys.path (as tests/models/simple/1/model.py).
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "PARAMETERS", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
