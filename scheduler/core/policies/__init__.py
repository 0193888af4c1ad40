"""Data-plane policies on the Scheduler interface, and ``make_scheduler`` to pick one by name."""

from __future__ import annotations

from typing import Any

from scheduler.core.api import Scheduler
from scheduler.core.policies.elsa import ElsaPolicy
from scheduler.core.policies.fifs import FifsPolicy
from scheduler.core.policies.orloj import OrlojPolicy
from scheduler.core.policies.ppipe import PPipePolicy
from scheduler.core.policies.reactive import ReactivePolicy
from scheduler.core.topology import Topology

POLICIES = {"ppipe": PPipePolicy, "reactive": ReactivePolicy, "fifs": FifsPolicy, "elsa": ElsaPolicy,
            "orloj": OrlojPolicy}


def make_scheduler(policy: str, topology: Topology, **opts: Any) -> Scheduler:
    """A fresh policy instance over ``topology`` (``opts`` go to its constructor)."""
    try:
        cls = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})") from None
    return cls(topology, **opts)
