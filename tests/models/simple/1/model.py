"""Triton's example ``simple`` model on the Python backend: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

import os
import sys

# The backend stub ignores PYTHONPATH for its own sys.path (see model_repository_gen/tritonserver.py).
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(a.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(a.dtype))]))
        return responses
