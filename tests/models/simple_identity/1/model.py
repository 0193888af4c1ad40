"""Triton's example ``simple_identity`` model on the Python backend: OUTPUT0 = INPUT0 (string tensors)."""

import os
import sys

# The backend stub ignores PYTHONPATH for its own sys.path (see model_repository_gen/tritonserver.py).
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
