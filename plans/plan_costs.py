"""The per-stage costs a plan's promise was made with, which the sidecar's promise check compares with what it
measures (scheduler.server.planned.promise_check).

plan.json records them in ``sustained.assumed_costs`` (an overheads document, as ``serve --overheads-out`` writes).
Plans written before that field still load: their costs are the request's ``--overheads`` where it recorded one,
else the defaults of the poolpipe that reads them (which may differ from those the plan was made with: said so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plans.plan_json import Plan
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import DEFAULT_OVERHEADS, Overheads

ASSUMED_COSTS = "assumed_costs"  # the key in plan.json's ``sustained`` section


def with_assumed_costs(sustained: Mapping[str, Any], costs: Overheads) -> dict[str, Any]:
    """A plan's ``sustained`` section with the costs its promise was made with recorded."""
    return {**sustained, ASSUMED_COSTS: costs.to_dict()}


def assumed_costs(plan: Plan) -> tuple[Overheads, str]:
    """(the costs ``plan``'s promise was made with, where they come from: recorded | request | default); a
    malformed record is a one-line InputError."""
    recorded = (plan.sustained or {}).get(ASSUMED_COSTS)
    if recorded is not None:
        return _costs(recorded, f"plan.json: sustained.{ASSUMED_COSTS}"), "recorded"
    given = (plan.request or {}).get("overheads")
    if given is not None:
        return _costs(given, "plan.json: request.overheads"), "request"
    return DEFAULT_OVERHEADS, "default"


def front_reserve_us(plan: Plan) -> float:
    """The time before the SLO at which ``plan``'s promise assumed each deadline falls (its costs' ``front_us``): what
    ``serve`` keeps for the way outside its clock unless told otherwise, so that serving and the promise agree."""
    return assumed_costs(plan)[0].front_us


def _costs(raw: Any, where: str) -> Overheads:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: expected an overheads object, got {raw!r:.80}")
    try:
        return Overheads.from_dict(raw, where)
    except ValueError as e:
        raise InputError(str(e)) from None
