"""The model repository of the sidecar's native front end (``serve --native-grpc-port``): one model per planned
model, with the planned model's inputs, outputs and batch size, served by the poolpipe_front backend
(backends/native_front/), which hands every request to the sidecar; and with ``serve --passthrough-http``, one
per model of the pass-through Triton, which the backend forwards there over HTTP itself."""

from __future__ import annotations

import os
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


PASSTHROUGH_INSTANCES = 16  # requests one pass-through model forwards at once (each instance: one at a time)


def passthrough_unsupported(upstream: mc.ModelConfig) -> str | None:
    """Why the front end cannot forward this model of the pass-through Triton request by request (it then stays
    on the sidecar's own ports), or None."""
    if upstream.HasField("sequence_batching"):
        return "a stateful (sequence batching) model"
    if upstream.model_transaction_policy.decoupled:
        return "a decoupled model"
    return None


def passthrough_front_config(upstream: mc.ModelConfig, address: str) -> mc.ModelConfig:
    """The front model that forwards a pass-through Triton's model to ``address`` (its HTTP HOST:PORT): the tensors
    as clients send them (no reshape: the backend forwards what it received) and no labels (the classification
    extension is the pass-through Triton's on the sidecar's ports)."""
    cfg = mc.ModelConfig(name=upstream.name, backend=native_front.BACKEND, max_batch_size=upstream.max_batch_size)
    cfg.input.extend(upstream.input)
    cfg.output.extend(upstream.output)
    for tensor in (*cfg.input, *cfg.output):
        tensor.ClearField("reshape")
    for tensor in cfg.output:
        tensor.ClearField("label_filename")
    cfg.instance_group.add(count=PASSTHROUGH_INSTANCES, kind=mc.ModelInstanceGroup.KIND_CPU)
    cfg.parameters[native_front.UPSTREAM_PARAMETER].string_value = address
    return cfg


def write_front_repository(repository: Path, planned: Iterable[mc.ModelConfig], library: Path,
                           passthrough: Iterable[mc.ModelConfig] = ()) -> Path:
    """``repository`` with one front model per planned config and per pass-through front config
    (:func:`passthrough_front_config`), the backend library in each version directory."""
    for cfg in (*map(front_config, planned), *passthrough):
        version = repository / cfg.name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (repository / cfg.name / "config.pbtxt").write_text(config_text(cfg))
        # a new file, not the loaded one rewritten in place (a tritonserver that maps it would crash: a reload
        # writes a served model's directory again)
        tmp = version / f".{native_front.LIBRARY}.tmp"
        shutil.copyfile(library, tmp)
        os.replace(tmp, version / native_front.LIBRARY)
    return repository
