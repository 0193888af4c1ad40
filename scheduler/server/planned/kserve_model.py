"""A planned model as KServe v2 describes it: its metadata and its Triton model configuration (what the sidecar
honours of the dynamic batcher, the SLO and the pipelines as parameters)."""

from __future__ import annotations

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from model_repository_gen.manifest import ModelInfo
from poolpipe_common.tensors import TensorSpec

PLATFORM = "poolpipe_pipeline"


def model_metadata(m: ModelInfo) -> service_pb2.ModelMetadataResponse:
    def tensors(ts: tuple[TensorSpec, ...]) -> list:
        return [service_pb2.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype,
                                                                 shape=[-1, *t.shape]) for t in ts]
    return service_pb2.ModelMetadataResponse(name=m.name, versions=["1"], platform=PLATFORM,
                                             inputs=tensors(m.inputs), outputs=tensors(m.outputs))


def model_config(m: ModelInfo) -> service_pb2.ModelConfigResponse:
    cfg = mc.ModelConfig(name=m.name, platform=PLATFORM, max_batch_size=m.max_batch_size)
    for t in m.inputs:
        cfg.input.add(name=t.name, data_type=mc.DataType.Value("TYPE_" + t.datatype), dims=list(t.shape))
    for t in m.outputs:
        cfg.output.add(name=t.name, data_type=mc.DataType.Value("TYPE_" + t.datatype), dims=list(t.shape))
    if m.dynamic_batching.active:  # what the sidecar honours of Triton's dynamic batcher
        json_format.ParseDict(m.dynamic_batching.to_dict(), cfg.dynamic_batching)
    cfg.parameters["poolpipe_slo_us"].string_value = str(m.slo_us)
    cfg.parameters["poolpipe_pipelines"].string_value = ",".join(p.id for p in m.pipelines)
    return service_pb2.ModelConfigResponse(config=cfg)
