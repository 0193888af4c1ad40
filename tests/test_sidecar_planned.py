"""The sidecar serving a planned model over real tritonservers generated from a plan (two host classes on
loopback, five servers): answers equal onnxruntime, concurrency, client shared memory, input validation,
a pass-through model beside the planned one, the reactive policy stage by stage, and the batch log (faults and
overload: tests/test_sidecar_planned_faults.py)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from loadtest.grpc_floor import chained_stage_calls
from loadtest.open_loop import open_loop
from poolpipe_common.overheads import FRONT_QUANTILES, SIDECAR_LATENCY_PARAMETER, Overheads
from runtime.sidecar_process import SidecarProcess
from tests.planned_testbed import MODEL, SLO_US, inputs, metric, metrics_text, planned_testbed, reference

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory):
    yield from planned_testbed(tmp_path_factory)


def test_answers_equal_onnxruntime_over_grpc_and_http(testbed: dict) -> None:
    sc = testbed["sc"]
    g, h = grpcclient.InferenceServerClient(sc.grpc_url), httpclient.InferenceServerClient(sc.http_url)
    assert g.is_server_ready() and h.is_model_ready(MODEL)
    meta = h.get_model_metadata(MODEL)  # one model with the full model's inputs and outputs
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 112, 112]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert g.get_model_config(MODEL).config.max_batch_size == 4
    for n, seed in ((1, 1), (3, 2)):
        x = inputs(n, seed)
        gi = grpcclient.InferInput("input", [n, 3, 112, 112], "FP32")
        gi.set_data_from_numpy(x)
        np.testing.assert_allclose(g.infer(MODEL, [gi]).as_numpy("logits"), reference(testbed, x), atol=1e-4)
        hi = httpclient.InferInput("input", [n, 3, 112, 112], "FP32")
        hi.set_data_from_numpy(x)
        np.testing.assert_allclose(h.infer(MODEL, [hi]).as_numpy("logits"), reference(testbed, x), atol=1e-4)
    hj = httpclient.InferInput("input", [1, 3, 112, 112], "FP32")
    hj.set_data_from_numpy(inputs(1, 3), binary_data=False)  # JSON tensors both ways
    res = h.infer(MODEL, [hj], outputs=[httpclient.InferRequestedOutput("logits", binary_data=False)])
    np.testing.assert_allclose(res.as_numpy("logits"), reference(testbed, inputs(1, 3)), atol=1e-4)
    m = metrics_text(sc)
    assert metric(m, "poolpipe_sidecar_hops_total", 'kind="shm"') > 0   # hostA -> hostA through shm
    assert metric(m, "poolpipe_sidecar_hops_total", 'kind="http"') > 0  # hostA -> hostB as bytes (stage calls: HTTP)
    assert g.get_inference_statistics(MODEL).model_stats[0].inference_stats.success.count >= 5
    stages = [json.loads(line) for line in (testbed["work"] / "batches.jsonl").read_text().splitlines()]
    vgpus = {v.id for v in testbed["manifest"].vgpus}
    assert stages and all(s["vgpu"] in vgpus and s["end_s"] >= s["start_s"] and s["batch"] >= 1 for s in stages)
    assert {s["stage"] for s in stages} == {0, 1, 2}  # every partition of the 3-stage pipeline ran and was logged
    # where a stage call's time goes: arrival <= input at hand <= sent <= answered, around the compute interval
    assert all(s["arrival_s"] <= s["ready_s"] <= s["sent_s"] <= s["received_s"] and s["end_s"] <= s["received_s"]
               and s["reserved_start_s"] is not None for s in stages)


def test_answers_report_the_sidecars_own_time_so_a_client_measures_the_way_outside_it(testbed: dict) -> None:
    """Each planned answer carries the sidecar's time from its handler to its answer (gRPC and HTTP alike); the
    open-loop client takes its latency less that as the way outside the sidecar's clock, per answer, which the
    overheads file carries as quantiles for the simulator and the planner."""
    sc = testbed["sc"]
    x = inputs(1, 7)
    h = httpclient.InferenceServerClient(sc.http_url)
    hi = httpclient.InferInput("input", [1, 3, 112, 112], "FP32")
    hi.set_data_from_numpy(x)
    reported = h.infer(MODEL, [hi]).get_response()["parameters"][SIDECAR_LATENCY_PARAMETER]
    assert 0 < reported < SLO_US
    r = open_loop([sc.grpc_url], MODEL, [0.02 * i for i in range(12)], SLO_US / 1e3)
    assert r.errors == 0 and len(r.front_us) == len(r.latencies_ms) == 12
    assert all(f < ms * 1e3 for f, ms in zip(r.front_us, r.latencies_ms))  # the sidecar's own time is > 0
    assert all(f >= 0.0 for f in r.front_us)  # the sidecar's time lies within the client's
    ov = Overheads(front_us=2000.0).with_front_samples(r.front_us)
    assert len(ov.front_quantiles_us) == FRONT_QUANTILES and ov.front_at(1.0) == max(0.0, max(r.front_us))


def test_the_sidecar_exports_the_rate_its_measured_costs_imply_beside_the_promise(testbed: dict) -> None:
    """Once it measured enough stage calls, the sidecar's promise check (every few seconds) exports per model the rate
    the plan sustains at the per-stage costs measured now beside the plan's promise (this hand-made plan records
    none: the closed form's at the default costs); the log says what the check compares."""
    sc = testbed["sc"]
    labels = f'model="{MODEL}"'
    deadline = time.monotonic() + 180
    while math.isnan(implied := metric(metrics_text(sc), "poolpipe_sidecar_sustainable_rps", labels)):
        assert time.monotonic() < deadline, "no implied rate after 3 minutes of load"
        r = open_loop([sc.grpc_url], MODEL, [0.005 * i for i in range(100)], SLO_US / 1e3)
        assert r.errors == 0
    promised = metric(metrics_text(sc), "poolpipe_sidecar_promised_rps", labels)
    print(f"promised {promised:.1f} req/s, implied by the costs measured {implied:.1f} (onnxruntime on this CPU, "
          "against a profile timed 5x slower)")
    assert promised > 0 and implied > 0
    assert metric(metrics_text(sc), "poolpipe_sidecar_promise_at_risk", labels) in (0.0, 1.0)
    assert "event=promise_check " in (testbed["work"] / "sidecar.log").read_text()


def test_stage_lead_times_are_calibrated_at_start(testbed: dict) -> None:
    """Before listening, the sidecar ran zeros through every stage and measured how long after sending a stage
    its compute starts (and how long its response takes); the core's clock leads by the first stage's lead;
    calibration batches are not logged."""
    log_text = (testbed["work"] / "sidecar.log").read_text()
    leads = {}
    for line in log_text.splitlines():
        if "event=stage_lead" in line:
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            leads[(fields["pipeline"], int(fields["stage"]))] = float(fields["batch1_us"])
            assert 0 < float(fields["tail1_us"]) < SLO_US  # compute end -> response, added to the stage latency
    manifest = testbed["manifest"]
    want = {(p.id, k) for m in manifest.models for p in m.pipelines for k in range(len(p.stages))}
    assert set(leads) == want
    assert all(0 < v < SLO_US for v in leads.values())
    clock = [float(line.rsplit("lead_us=", 1)[1]) for line in log_text.splitlines() if "event=clock_lead" in line]
    assert len(clock) == 1 and 0 < clock[0] <= min(v for (_, k), v in leads.items() if k == 0)
    assert log_text.index("event=clock_lead") < log_text.index("event=listening")
    g = grpcclient.InferenceServerClient(testbed["sc"].grpc_url)
    gi = grpcclient.InferInput("input", [1, 3, 112, 112], "FP32")
    gi.set_data_from_numpy(inputs(1, 4))
    g.infer(MODEL, [gi])  # at least one client batch, whichever tests ran before
    logged = [json.loads(line) for line in (testbed["work"] / "batches.jsonl").read_text().splitlines()]
    assert {s["stage"] for s in logged} == {0, 1, 2} and all(s["dispatch"] > 0 for s in logged)
    # only client batches: the rows of the logged batches that ran to the last stage are rows clients were answered
    # (calibration's zeros are not logged)
    done = {s["dispatch"] for s in logged if s["stage"] == 2}
    rows = sum(s["batch"] for s in logged if s["stage"] == 0 and s["dispatch"] in done)
    assert 0 < rows <= g.get_inference_statistics(MODEL).model_stats[0].inference_count


def test_many_concurrent_clients_are_batched(testbed: dict) -> None:
    """Eight clients (gRPC and HTTP, asyncio) with a request always outstanding: all answered, in batches."""
    sc = testbed["sc"]
    xs = [inputs(1, 100 + i) for i in range(48)]

    async def main() -> list[np.ndarray]:
        gs = [grpcaio.InferenceServerClient(sc.grpc_url) for _ in range(4)]
        hs = [httpaio.InferenceServerClient(sc.http_url) for _ in range(4)]
        outs: list[np.ndarray | None] = [None] * len(xs)

        async def client(k: int) -> None:
            mod, c = (grpcclient, gs[k // 2]) if k % 2 else (httpclient, hs[k // 2])
            for i in range(k, len(xs), 8):
                inp = mod.InferInput("input", [1, 3, 112, 112], "FP32")
                inp.set_data_from_numpy(xs[i])
                outs[i] = (await c.infer(MODEL, [inp])).as_numpy("logits")
        try:
            await asyncio.gather(*[client(k) for k in range(8)])
        finally:
            for c in [*gs, *hs]:
                await c.close()
        return outs  # type: ignore[return-value]

    before = metrics_text(sc)
    outs = asyncio.run(main())
    ref = reference(testbed, np.concatenate(xs))
    for i, o in enumerate(outs):
        np.testing.assert_allclose(o[0], ref[i], atol=1e-4)
    after = metrics_text(sc)
    batches = metric(after, "poolpipe_sidecar_batch_size_count") - metric(before, "poolpipe_sidecar_batch_size_count")
    samples = metric(after, "poolpipe_sidecar_batch_size_sum") - metric(before, "poolpipe_sidecar_batch_size_sum")
    assert samples == 48 and batches < 48  # the sidecar formed batches of several requests


@pytest.mark.parametrize("mod,url", [(grpcclient, "grpc_url"), (httpclient, "http_url")])
def test_client_shared_memory(testbed: dict, mod, url: str) -> None:
    sc = testbed["sc"]
    c = mod.InferenceServerClient(getattr(sc, url))
    tag = f"{os.getpid()}_{url}"
    x = inputs(2, 7)
    out_bytes = 2 * 10 * 4
    in_h = shm.create_shared_memory_region(f"in_{tag}", f"/sc_in_{tag}", 64 + x.nbytes)
    out_h = shm.create_shared_memory_region(f"out_{tag}", f"/sc_out_{tag}", 128 + out_bytes)
    try:
        shm.set_shared_memory_region(in_h, [x], offset=64)
        c.register_system_shared_memory(f"in_{tag}", f"/sc_in_{tag}", 64 + x.nbytes)
        c.register_system_shared_memory(f"out_{tag}", f"/sc_out_{tag}", 128 + out_bytes)
        inp = mod.InferInput("input", list(x.shape), "FP32")
        inp.set_shared_memory(f"in_{tag}", x.nbytes, offset=64)
        out = mod.InferRequestedOutput("logits")
        out.set_shared_memory(f"out_{tag}", out_bytes, offset=128)
        c.infer(MODEL, [inp], outputs=[out])
        got = shm.get_contents_as_numpy(out_h, np.float32, [2, 10], offset=128)
        np.testing.assert_allclose(got, reference(testbed, x), atol=1e-4)
        small = mod.InferRequestedOutput("logits")
        small.set_shared_memory(f"out_{tag}", out_bytes - 4)
        with pytest.raises(InferenceServerException, match="should be at least 80 bytes"):
            c.infer(MODEL, [inp], outputs=[small])
    finally:
        c.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_h)
        shm.destroy_shared_memory_region(out_h)


def test_bad_inputs_get_triton_style_errors(testbed: dict) -> None:
    sc = testbed["sc"]
    c = grpcclient.InferenceServerClient(sc.grpc_url)

    def infer(name: str = "input", shape: tuple = (1, 3, 112, 112), dtype: str = "FP32", outputs=None) -> None:
        i = grpcclient.InferInput(name, list(shape), dtype)
        i.set_data_from_numpy(np.zeros(shape, dtype=np.float32 if dtype == "FP32" else np.int32))
        c.infer(MODEL, [i], outputs=outputs)

    cases = [
        (dict(name="image"), "unexpected inference input 'image' for model 'resnet'"),
        (dict(dtype="INT32"), "data-type is 'INT32', but model 'resnet' expects 'FP32'"),
        (dict(shape=(1, 3, 112, 111)), re.escape("Expected [-1,3,112,112], got [1,3,112,111]")),
        (dict(shape=(5, 3, 112, 112)), "batch-size must be <= 4"),
        (dict(outputs=[grpcclient.InferRequestedOutput("probs")]), "unexpected inference output 'probs'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InferenceServerException, match=message) as e:
            infer(**kwargs)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    # Raw bytes that do not match the declared shape (bypassing tritonclient's own checks).
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(sc.grpc_url))
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="input", datatype="FP32", shape=[1, 3, 112, 112])
    req.raw_input_contents.append(b"\0" * 100)
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("input byte size mismatch for input 'input' for model 'resnet'. Expected 150528, got 100"
            in err.value.details())
    assert c.is_server_live() and c.is_model_ready(MODEL)  # and it keeps serving


def test_planned_and_passthrough_models_side_by_side(testbed: dict) -> None:
    """One endpoint: the planned model and an unplanned Triton model; one client shm region serves both."""
    work = testbed["work"]
    models = Path(__file__).resolve().parent / "models"
    from runtime.tritonserver import TritonProcess
    with TritonProcess(models, log_path=work / "simple.log") as triton, \
            SidecarProcess(manifest=testbed["deploy"], passthrough=triton.grpc_url, log_path=work / "both.log") as sc:
        c = grpcclient.InferenceServerClient(sc.grpc_url)
        names = {m.name for m in c.get_model_repository_index().models}
        assert {"simple", MODEL} <= names
        assert c.is_model_ready("simple") and c.is_model_ready(MODEL)
        tag = f"both_{os.getpid()}"
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        x = inputs(1, 11)
        size = 4096 + x.nbytes
        h = shm.create_shared_memory_region(tag, f"/{tag}", size)
        try:
            shm.set_shared_memory_region(h, [a])
            shm.set_shared_memory_region(h, [x], offset=4096)
            c.register_system_shared_memory(tag, f"/{tag}", size)
            i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
            i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
            i0.set_shared_memory(tag, 64)
            i1.set_shared_memory(tag, 64)
            o0 = grpcclient.InferRequestedOutput("OUTPUT0")
            o0.set_shared_memory(tag, 64, offset=64)
            c.infer("simple", [i0, i1], outputs=[o0])  # pass-through: Triton reads/writes the region itself
            np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.int32, [1, 16], offset=64), 2 * a)
            xi = grpcclient.InferInput("input", [1, 3, 112, 112], "FP32")
            xi.set_shared_memory(tag, x.nbytes, offset=4096)
            lo = grpcclient.InferRequestedOutput("logits")
            lo.set_shared_memory(tag, 40, offset=1024)
            c.infer(MODEL, [xi], outputs=[lo])  # planned: the sidecar reads/writes the region
            np.testing.assert_allclose(shm.get_contents_as_numpy(h, np.float32, [1, 10], offset=1024),
                                       reference(testbed, x), atol=1e-4)
            c.unregister_system_shared_memory(tag)
            assert not grpcclient.InferenceServerClient(triton.grpc_url).get_system_shared_memory_status().regions
        finally:
            shm.destroy_shared_memory_region(h)


def test_hosts_at_one_address_share_a_machine_for_shm(testbed: dict) -> None:
    """Cluster files list one host per GPU type; two such hosts at one address are one machine."""
    from dataclasses import replace

    from scheduler.server.planned.fleet import machines

    m = testbed["manifest"]
    assert machines(m) == {"hostA": "hostA", "hostB": "hostB"}  # 127.0.0.1 and 127.0.0.2
    same = replace(m, hosts=tuple(replace(h, address="127.0.0.1") for h in m.hosts))
    assert machines(same) == {"hostA": "hostA", "hostB": "hostA"}


def test_reactive_policy_runs_live_stage_by_stage(testbed: dict) -> None:
    """`--policy reactive` dispatches one stage at a time (non-final dispatches carry the boundary tensors
    between pools through the same driver loop): answers equal ONNX Runtime's."""
    work = testbed["work"]
    sc = SidecarProcess(manifest=testbed["deploy"], log_path=work / "reactive.log",
                        extra_args=("--policy", "reactive", "--batch-log", str(work / "reactive.jsonl"),
                                    "--overheads-out", str(work / "overheads.json"))).start()
    try:
        xs = [inputs(1, 300 + i) for i in range(12)]

        async def main() -> list[np.ndarray | InferenceServerException]:
            g = grpcaio.InferenceServerClient(sc.grpc_url)
            try:
                async def one(x: np.ndarray) -> np.ndarray | InferenceServerException:
                    inp = grpcclient.InferInput("input", [1, 3, 112, 112], "FP32")
                    inp.set_data_from_numpy(x)
                    try:
                        return (await g.infer(MODEL, [inp], client_timeout=20)).as_numpy("logits")
                    except InferenceServerException as e:  # a shed on a loaded machine is an answer too
                        return e
                out: list[np.ndarray | InferenceServerException] = []
                for wave in range(3):  # four at a time: batches form, the 2 cores are not swamped
                    out += await asyncio.gather(*[one(x) for x in xs[4 * wave:4 * wave + 4]])
                return out
            finally:
                await g.close()

        outs = asyncio.run(main())
        ref = reference(testbed, np.concatenate(xs))
        answered = [i for i, o in enumerate(outs) if isinstance(o, np.ndarray)]
        assert len(answered) >= 8, [o for o in outs if not isinstance(o, np.ndarray)][:2]
        for i in answered:
            np.testing.assert_allclose(outs[i][0], ref[i], atol=1e-4)
        stages = [json.loads(line) for line in (work / "reactive.jsonl").read_text().splitlines()]
        by_dispatch: dict[int, set[int]] = {}
        for s in stages:
            by_dispatch.setdefault(s["dispatch"], set()).add(s["stage"])
        assert all(len(v) == 1 for v in by_dispatch.values())  # one stage per dispatch
        assert {s["stage"] for s in stages} == {0, 1, 2}
    finally:
        assert sc.stop() == 0
    # On shutdown it wrote what serving added to the profiled compute, for `simulate --overheads`.
    ov = Overheads.from_dict(json.loads((work / "overheads.json").read_text()))
    assert 0 < ov.lead_us < SLO_US and 0 < ov.tail_us < SLO_US and ov.slowdown > 0


def test_the_bare_chain_of_stage_calls_computes_the_model(testbed: dict) -> None:
    """The floor benchmarks/sidecar.py prints under the planned path (its stage calls chained by a bare client)
    does the planned path's work: its answer is the whole model's."""
    x = inputs(1, 3)
    lat, out = asyncio.run(chained_stage_calls(testbed["manifest"], MODEL, x, 2, gap_s=0.0))
    assert len(lat) == 2  # the warm-up requests are not timed
    np.testing.assert_allclose(np.frombuffer(out, np.float32).reshape(1, -1), reference(testbed, x), atol=1e-4)
