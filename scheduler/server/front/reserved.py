"""Request parameters the sidecar decides on: Triton's reserved sequence parameters, which a planned model cannot
honour (it has no sequence batcher: the sidecar batches stateless rows), so a request that names a sequence is
refused, as Triton refuses what a model cannot do, instead of being answered as if it were stateless; and headers
forwarded as parameters."""

from __future__ import annotations

from typing import Any

from scheduler.server.common.errors import invalid

SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def _set(param: Any) -> bool:
    """A sequence parameter that says something: a non-zero or non-empty id, a true flag (tritonclient sends none
    of them for sequence_id 0)."""
    kind = param.WhichOneof("parameter_choice")
    return bool(getattr(param, kind)) if kind is not None else False


def refuse_sequences(model: str, parameters: Any) -> None:
    """INVALID_ARGUMENT naming the first sequence parameter the request sets, and why."""
    for name in SEQUENCE_PARAMETERS:
        if name in parameters and _set(parameters[name]):
            raise invalid(f"inference request to model '{model}' sets the reserved parameter '{name}', but "
                          f"'{model}' is a planned model served by poolpipe and has no sequence batcher: its "
                          "requests are stateless, so a sequence cannot be kept (send sequences to a stateful model "
                          "on the pass-through Triton)")


def add_parameters(message: Any, params: dict[str, str]) -> None:
    """Headers forwarded as request parameters (Triton's --grpc-header-forward-pattern): each a string parameter,
    unless the request sets that parameter itself."""
    for key, value in params.items():
        if key not in message.parameters:
            message.parameters[key].string_param = value
