"""A planned request's own parameters on its stage calls, so that a stage model reads them as a Triton model reads its
request's (``request.parameters()`` in the Python backend, ``TRITONBACKEND_RequestParameter`` in C).

Triton gives a model every request parameter it does not reserve for itself: the client's own (tritonclient's
``parameters=``) and the headers its ``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern`` turn into
string parameters; the sidecar makes them the same way. But one stage call carries the rows of several requests, so
it cannot be each request's. Each stage call of a batch therefore carries:

- under their own names, the parameters that all its requests' rows agree on (name, type and value): every parameter
  of a batch of one request, and a header that all its requests share (a tenant), so a model written for Triton reads
  them as there;
- when any row has one, ``poolpipe_row_parameters``: a JSON array with each row's parameters, in the order of the
  call's tensor rows (a padded batch's dummy rows: ``{}``), for a model that must tell its rows apart.

Every stage call carries them, not only the first: each stage is a Triton model of its own that someone may write
against. A request without custom parameters adds nothing to its calls."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Value = bool | int | float | str

# Triton's reserved request parameters (its parameters extension), and the HTTP endpoint's own: never a model's
RESERVED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                      "binary_data_output"})
ROW_PARAMETERS = "poolpipe_row_parameters"
INT64_MAX = 2**63 - 1


def custom_parameters(params: Any) -> dict[str, Value] | None:
    """A request's parameters that are its model's (a ModelInferRequest's ``parameters``): not Triton's reserved
    ones, not those with its ``triton_`` prefix, not ours; None when there are none."""
    out: dict[str, Value] = {}
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        if kind is None or key in RESERVED or key.startswith("triton_") or key == ROW_PARAMETERS:
            continue
        out[key] = getattr(p, kind)
    return out or None


def _agree(rows: Sequence[Mapping[str, Value]]) -> dict[str, Value]:
    first, *rest = rows
    return {k: v for k, v in first.items()
            if all(k in r and type(r[k]) is type(v) and r[k] == v for r in rest)}


def stage_parameters(rows: Sequence[Mapping[str, Value] | None], pad: int = 0) -> dict[str, Value]:
    """The parameters of a stage call whose tensor rows are ``rows`` (each row's request's custom parameters, None:
    none) and ``pad`` dummy rows after them: {} when no row has any."""
    if not any(rows):
        return {}
    given = [r or {} for r in rows]
    return {**_agree(given), ROW_PARAMETERS: json.dumps([*given, *[{}] * pad], separators=(",", ":"))}


def set_grpc_parameter(target: Any, key: str, value: Value) -> None:
    """``value`` into a ModelInferRequest's ``parameters[key]`` as Triton's gRPC endpoint takes it (bool, int64,
    double, string; an integer beyond int64, which it refuses as uint64, as a double, as its HTTP endpoint reads it)."""
    p = target[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int) and -INT64_MAX - 1 <= value <= INT64_MAX:
        p.int64_param = value
    elif isinstance(value, (int, float)):
        p.double_param = float(value)
    else:
        p.string_param = value
