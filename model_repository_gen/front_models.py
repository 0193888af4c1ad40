"""The model repository of the sidecar's native front end (``serve --native-grpc-port``): one model per planned
model, with the planned model's inputs, outputs and batch size, served by the poolpipe_front backend
(backends/native_front/), which hands every request to the sidecar."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from backends import native_front
from model_repository_gen.triton_config import config_text


def front_config(planned: mc.ModelConfig) -> mc.ModelConfig:
    """The front model of a planned model's config (what the sidecar answers to ModelConfig): same name, tensors
    and max batch size; one CPU instance, whose execute only forwards; Triton's dynamic batcher hands it every
    request queued at once (grouping only: the sidecar forms the batches)."""
    cfg = mc.ModelConfig(name=planned.name, backend=native_front.BACKEND, max_batch_size=planned.max_batch_size)
    cfg.input.extend(planned.input)
    cfg.output.extend(planned.output)
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    if planned.max_batch_size > 0:
        cfg.dynamic_batching.max_queue_delay_microseconds = 0
    return cfg


def write_front_repository(repository: Path, planned: Iterable[mc.ModelConfig], library: Path) -> Path:
    """``repository`` with one front model per planned config, the backend library in each version directory."""
    for p in planned:
        cfg = front_config(p)
        version = repository / cfg.name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (repository / cfg.name / "config.pbtxt").write_text(config_text(cfg))
        shutil.copyfile(library, version / native_front.LIBRARY)
    return repository
