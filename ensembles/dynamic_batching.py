"""Triton-native serving of a generated deployment: every partition model gets Triton's own dynamic batcher,
as a Triton user runs whole models today (the baseline poolpipe's sidecar must beat). Meant for plans whose
pipelines are one partition each (the `np` planner's whole-model plans): clients then call the servers
directly, spread round-robin, with no sidecar in front."""

from __future__ import annotations

from pathlib import Path

from model_repository_gen.manifest import Manifest
from model_repository_gen.triton_config import config_text, parse_config
from poolpipe_common.errors import InputError


def whole_model_endpoints(manifest: Manifest, model: str) -> list[str]:
    """gRPC URLs of the vGPUs that serve ``model`` whole (one stage); InputError when it is partitioned."""
    m = next((x for x in manifest.models if x.name == model), None)
    if m is None:
        raise InputError(f"model {model!r} is not in the manifest")
    if any(len(p.stages) != 1 for p in m.pipelines):
        raise InputError(f"model {model!r} is partitioned: Triton-native serving needs whole-model pipelines (np)")
    urls = {g.id: g.grpc_url for g in manifest.vgpus}
    return [urls[v] for p in m.pipelines for v in p.stages[0].vgpus]


def enable_dynamic_batching(deploy: Path, manifest: Manifest, queue_delay_fraction: float = 0.5) -> int:
    """Give each whole-model config.pbtxt Triton's dynamic batcher: preferred batch = the planned batch, queue
    delay = ``queue_delay_fraction`` of the slack its SLO leaves over the planned batch's latency (a Triton
    user's usual tuning); returns how many configs were changed."""
    repository = {g.id: g.repository for g in manifest.vgpus}
    changed = 0
    for m in manifest.models:
        for p in m.pipelines:
            stage = p.stages[0]
            slack = m.slo_us - stage.latency_us.get(p.batch, max(stage.latency_us.values()))
            delay = int(max(0.0, queue_delay_fraction * slack))
            for v in stage.vgpus:
                path = deploy / repository[v] / stage.triton_model / "config.pbtxt"
                cfg = parse_config(path)
                cfg.dynamic_batching.preferred_batch_size[:] = [p.batch]
                cfg.dynamic_batching.max_queue_delay_microseconds = delay
                path.write_text(config_text(cfg))
                changed += 1
    return changed
