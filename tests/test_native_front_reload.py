"""The native front end follows a reload: after ``POST /v2/poolpipe/reload`` to a plan whose model takes larger
batches, the native port serves the new plan's config (Triton checks requests against it) and answers as the
sidecar's own port does."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from backends import native_front
from poolpipe_common.net import free_port
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment


def _input(client: grpcclient.InferenceServerClient, batch: int) -> tuple[grpcclient.InferInput, str]:
    meta = client.get_model_metadata(EMULATED_MODEL)
    shape = [batch, *[int(d) for d in meta.inputs[0].shape[1:]]]
    inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
    inp.set_data_from_numpy(np.random.default_rng(batch).random(shape, dtype=np.float32))
    return inp, meta.outputs[0].name


def _reload(sc: SidecarProcess, manifest: Path) -> dict:
    req = urllib.request.Request(f"http://{sc.http_url}/v2/poolpipe/reload",
                                 data=json.dumps({"manifest": str(manifest)}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=90) as r:
        return json.loads(r.read())


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_the_native_front_serves_the_plan_a_reload_brings(tmp_path: Path) -> None:
    dir_a = build_emulated_deployment(tmp_path / "a", slo_us=3_000_000.0, batch=2)
    with Deployment(dir_a, check_hardware=False, log_dir=tmp_path / "logs-a"):
        # generated while A runs, so its free ports are not A's
        dir_b = build_emulated_deployment(tmp_path / "b", slo_us=3_000_000.0, batch=4,
                                          addresses=("127.0.0.1", "127.0.0.1"))
        port = free_port("127.0.0.1")
        log = tmp_path / "sidecar.log"
        with Deployment(dir_b, check_hardware=False, log_dir=tmp_path / "logs-b"), \
                SidecarProcess(manifest=dir_a, log_path=log, extra_args=("--native-grpc-port", str(port))) as sc:
            own, native = grpcclient.InferenceServerClient(sc.grpc_url), \
                grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            assert native.get_model_config(EMULATED_MODEL).config.max_batch_size == 2
            three, out = _input(own, 3)
            with pytest.raises(InferenceServerException, match="batch"):
                native.infer(EMULATED_MODEL, [three])  # Triton checks the plan's max batch size
            assert _reload(sc, dir_b)["generation"] == 1
            deadline = time.monotonic() + 30
            while "event=native_front_followed_reload" not in log.read_text():
                assert time.monotonic() < deadline, f"the native front did not follow:\n{log.read_text()[-2000:]}"
                time.sleep(0.1)
            assert native.get_model_config(EMULATED_MODEL).config.max_batch_size == 4
            want = own.infer(EMULATED_MODEL, [three]).as_numpy(out)
            assert np.array_equal(native.infer(EMULATED_MODEL, [three]).as_numpy(out), want)
            assert "loaded=" + EMULATED_MODEL in log.read_text()
