"""Generating the next deployment beside a running one (``generate --previous DIR``), so that migration is cheap.

A vGPU of the new plan that the previous deployment also has (same id, host address and device settings: GPU,
MPS share) keeps its server: same ports, so ``launch`` leaves its process running and only loads the new partition
models into it through Triton's model-control API. Every other vGPU gets ports the previous deployment does not use,
so its new server starts while the old ones still serve. Partition models of generation N > 0 are named
``<partition>_g<N>``: a kept server then holds the old and the new model side by side until the switch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from model_repository_gen.manifest import Manifest
from model_repository_gen.ports import interface
from model_repository_gen.vgpu_env import DEVICE_ENV_KEYS

# DEVICE_ENV_KEYS: the environment that decides which device (and share of it) a server computes on; servers
# differing only in other variables (thread counts) can be kept.


def device_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[k] for k in DEVICE_ENV_KEYS if k in env}


def generation_suffix(generation: int) -> str:
    """What generation N appends to its partition models' names ('' for the first)."""
    return f"_g{generation}" if generation else ""


def kept_ports(previous: Manifest, new_vgpus: Sequence[tuple[str, str, Mapping[str, str]]]
               ) -> tuple[dict[str, tuple[int, int, int]], dict[str, set[int]]]:
    """(ports of the vGPUs whose servers stay, ports of the previous deployment per interface).

    ``new_vgpus``: (id, host address, environment) of each vGPU of the new plan."""
    busy: dict[str, set[int]] = {}
    old = {}
    for g in previous.vgpus:
        address = g.grpc_url.rsplit(":", 1)[0]
        busy.setdefault(interface(address), set()).update(g.ports)
        old[g.id] = (address, g.ports, device_env(g.env))
    keep = {}
    for vid, address, env in new_vgpus:
        if vid in old and old[vid][0] == address and old[vid][2] == device_env(env):
            keep[vid] = old[vid][1]
    return keep, busy
