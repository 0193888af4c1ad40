"""Triton's dynamic-batcher controls that the sidecar honours for a planned model: priority levels and queue policy.

The fields, defaults and checks are those of Triton's ``ModelDynamicBatching`` / ``ModelQueuePolicy``
(model_config.proto): level 1 is the highest priority; 0 levels means one queue. A request's ``priority`` outside
[1, priority_levels] gets the default level; its ``timeout`` replaces the level's default timeout only when
``allow_timeout_override`` is set and it is shorter (so with no default timeout it never applies). A queue timeout
that expires rejects the request (REJECT) or sends it behind every unexpired request of its level (DELAY).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from poolpipe_common.documents import as_int, check_fields
from poolpipe_common.errors import InputError

TIMEOUT_ACTIONS = ("REJECT", "DELAY")
QUEUE_POLICY_FIELDS = ("timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size")
DYNAMIC_BATCHING_FIELDS = ("priority_levels", "default_priority_level", "default_queue_policy",
                           "priority_queue_policy")
# Triton's own answers (UNAVAILABLE) when the queue refuses or times out a request.
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` for one priority level (0 = no timeout / no size limit)."""

    timeout_action: str = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        if self.timeout_action not in TIMEOUT_ACTIONS:
            raise InputError(f"timeout_action {self.timeout_action!r}: choose REJECT or DELAY")
        if self.default_timeout_us < 0 or self.max_queue_size < 0:
            raise InputError("default_timeout_microseconds and max_queue_size must be >= 0 (0: none)")

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout of a request asking for ``requested_us`` (0: none asked), as Triton applies it."""
        if self.allow_timeout_override and 0 < requested_us < self.default_timeout_us:
            return requested_us
        return self.default_timeout_us

    def to_dict(self) -> dict[str, Any]:
        return {"timeout_action": self.timeout_action, "default_timeout_microseconds": self.default_timeout_us,
                "allow_timeout_override": self.allow_timeout_override, "max_queue_size": self.max_queue_size}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "QueuePolicy":
        check_fields(d, QUEUE_POLICY_FIELDS, where)
        override = d.get("allow_timeout_override", False)
        if not isinstance(override, bool):
            raise InputError(f"{where}.allow_timeout_override: expected true or false, got {override!r}")
        action = d.get("timeout_action", "REJECT")
        if action not in TIMEOUT_ACTIONS:
            raise InputError(f"{where}.timeout_action: {action!r} is not REJECT or DELAY")
        return cls(action, as_int(d.get("default_timeout_microseconds", 0), f"{where}.default_timeout_microseconds", 0),
                   override, as_int(d.get("max_queue_size", 0), f"{where}.max_queue_size", 0))


@dataclass(frozen=True)
class BatcherControls:
    """A planned model's ``dynamic_batching`` controls; the default (no levels, default policy) changes nothing."""

    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.priority_levels
        if n < 0:
            raise InputError(f"priority_levels must be >= 0, got {n}")
        if n > 0 and not 1 <= self.default_priority_level <= n:
            raise InputError(f"default_priority_level must be in range [1, {n}] (priority_levels is {n}), got "
                             f"{self.default_priority_level}")
        if n == 0 and self.default_priority_level != 0:
            raise InputError("default_priority_level is set but priority_levels is 0: set priority_levels too")
        bad = [k for k in self.priority_queue_policy if not 1 <= k <= n]
        if bad:
            raise InputError(f"priority_queue_policy: priority level {bad[0]} must be in range [1, {n}] "
                             f"(priority_levels is {n})")

    @functools.cached_property
    def active(self) -> bool:
        """Whether anything differs from Triton's defaults (a plain FIFO queue with no limits); asked per request,
        so computed once."""
        return self != BatcherControls()

    def level(self, priority: int) -> int:
        """The queue level of a request asking for ``priority`` (0 or out of range: the default level)."""
        if self.priority_levels == 0:
            return 0
        return priority if 1 <= priority <= self.priority_levels else self.default_priority_level

    def policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's (and the model config's) ``dynamic_batching`` object, in Triton's field names."""
        out: dict[str, Any] = {"priority_levels": self.priority_levels,
                               "default_priority_level": self.default_priority_level,
                               "default_queue_policy": self.default_queue_policy.to_dict()}
        if self.priority_queue_policy:
            out["priority_queue_policy"] = {str(k): p.to_dict() for k, p in sorted(self.priority_queue_policy.items())}
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str = "dynamic_batching") -> "BatcherControls":
        check_fields(d, DYNAMIC_BATCHING_FIELDS, where)
        per = d.get("priority_queue_policy") or {}
        if not isinstance(per, dict):
            raise InputError(f"{where}.priority_queue_policy: expected an object of level -> queue policy")
        levels = {}
        for k, v in per.items():
            if not str(k).isdigit():
                raise InputError(f"{where}.priority_queue_policy: key {k!r} is not a priority level (1, 2, ...)")
            levels[int(k)] = QueuePolicy.from_dict(v, f"{where}.priority_queue_policy.{k}")
        try:
            return cls(as_int(d.get("priority_levels", 0), f"{where}.priority_levels", 0),
                       as_int(d.get("default_priority_level", 0), f"{where}.default_priority_level", 0),
                       QueuePolicy.from_dict(d.get("default_queue_policy") or {}, f"{where}.default_queue_policy"),
                       levels)
        except InputError as e:
            if str(e).startswith(where):
                raise
            raise InputError(f"{where}: {e}") from None
