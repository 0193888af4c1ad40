"""The Triton-only baseline: whole model behind Triton's dynamic batcher, and the partition chain as an ensemble."""

from __future__ import annotations

import numpy as np
import pytest

from ensembles.triton_baseline import (
    start_baseline,
    write_partition_ensemble,
    write_whole_model,
)
from model_repository_gen.triton_config import (
    BackendSettings,
    DynamicBatching,
    parse_config,
)
from poolpipe_common.errors import InputError
from profiling.zoo import build_zoo_model
from tests.deploy_helpers import make_profile, reference_output

pytestmark = pytest.mark.triton


def test_whole_model_with_dynamic_batcher_and_partition_ensemble_equal_the_full_model(tmp_path):
    import tritonclient.grpc as grpcclient

    onnx_path = build_zoo_model("mobilenet", tmp_path / "mobilenet.onnx")
    prof = make_profile(onnx_path, "mobilenet", 3, {"cpu": (1,)})
    repo = tmp_path / "repo"
    one_thread = BackendSettings(intra_op_threads=1)
    write_whole_model(repo, onnx_path, "mobilenet", 4, DynamicBatching((4,), 200_000), settings=one_thread)
    write_partition_ensemble(repo, onnx_path, prof, [1, 2], "mobilenet_ensemble", 4, settings=one_thread,
                             fp16_boundaries=False)
    whole = parse_config(repo / "mobilenet" / "config.pbtxt")
    assert list(whole.dynamic_batching.preferred_batch_size) == [4]
    assert whole.dynamic_batching.max_queue_delay_microseconds == 200_000
    ens = parse_config(repo / "mobilenet_ensemble" / "config.pbtxt")
    assert ens.platform == "ensemble"
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["mobilenet_b0_1", "mobilenet_b1_2",
                                                                    "mobilenet_b2_3"]

    x = np.random.default_rng(5).standard_normal((4, 3, 192, 192)).astype(np.float32)
    expected = reference_output(onnx_path, x)
    with start_baseline(repo, log_path=tmp_path / "triton.log") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)

        def request(arr):
            inp = grpcclient.InferInput("input", list(arr.shape), "FP32")
            inp.set_data_from_numpy(arr)
            return [inp]

        # four single-image requests in flight at once: the dynamic batcher joins them
        before = client.get_inference_statistics("mobilenet").model_stats[0]  # model_warmup ran batches 1 and 4
        results = [None] * 4

        def done(i):
            return lambda result, error: results.__setitem__(i, error or result)

        for i in range(4):
            client.async_infer("mobilenet", request(x[i:i + 1]), done(i))
        for _ in range(600):
            if all(r is not None for r in results):
                break
            __import__("time").sleep(0.05)
        for i, r in enumerate(results):
            assert not isinstance(r, Exception), r
            np.testing.assert_allclose(r.as_numpy("logits"), expected[i:i + 1], atol=1e-5, rtol=0)
        stats = client.get_inference_statistics("mobilenet").model_stats[0]
        assert stats.inference_count - before.inference_count == 4
        assert stats.execution_count - before.execution_count < 4

        y = client.infer("mobilenet_ensemble", request(x)).as_numpy("logits")
        np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)
        client.close()


def test_ensemble_rejects_cuts_outside_the_model(tmp_path):
    onnx_path = build_zoo_model("segnet", tmp_path / "segnet.onnx")
    prof = make_profile(onnx_path, "segnet", 2, {"cpu": (1,)})
    with pytest.raises(InputError, match=r"cuts \[2\]: each must lie in 1..1"):
        write_partition_ensemble(tmp_path / "r", onnx_path, prof, [2], "e", 2)
