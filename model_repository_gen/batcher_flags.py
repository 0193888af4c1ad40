"""``generate --dynamic-batching [MODEL=]SPEC``: Triton's dynamic_batching block (protobuf text, as in a
config.pbtxt) whose priority levels and queue policy the sidecar honours for a planned model."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from poolpipe_common.batcher import BatcherControls, QueuePolicy
from poolpipe_common.documents import read_text
from poolpipe_common.errors import InputError

ALL = "*"  # the key of a spec given without MODEL=: every planned model
# fields of Triton's dynamic_batching that form batches: the sidecar forms them by the plan, so they are ignored
BATCH_FORMING = ("preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering")


def _policy(p: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(mc.ModelQueuePolicy.TimeoutAction.Name(p.timeout_action), p.default_timeout_microseconds,
                       p.allow_timeout_override, p.max_queue_size)


def _parse(text: str, where: str) -> mc.ModelDynamicBatching:
    """The text as a dynamic_batching body, else as a model configuration's dynamic_batching block."""
    db = mc.ModelDynamicBatching()
    try:
        return text_format.Parse(text, db)
    except text_format.ParseError as e:
        first = e
    cfg = mc.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError:
        raise InputError(f"{where}: not Triton's dynamic_batching text: {first}") from None
    if not cfg.HasField("dynamic_batching"):
        raise InputError(f"{where}: the model configuration has no dynamic_batching block")
    return cfg.dynamic_batching


def parse_dynamic_batching(text: str, where: str) -> tuple[BatcherControls, list[str]]:
    """The controls of a ``dynamic_batching`` body (``priority_levels: 2 ...``) or of a whole config.pbtxt
    holding one; also the batch-forming fields it sets, which the sidecar ignores."""
    db = _parse(text, where)
    ignored = [f.name for f, _ in db.ListFields() if f.name in BATCH_FORMING]
    try:
        controls = BatcherControls(db.priority_levels, db.default_priority_level, _policy(db.default_queue_policy),
                                   {k: _policy(v) for k, v in db.priority_queue_policy.items()})
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return controls, ignored


def parse_dynamic_batching_args(values: Iterable[str]) -> tuple[dict[str, BatcherControls], list[str]]:
    """``[MODEL=]TEXT`` or ``[MODEL=]@FILE`` flags -> {model or '*': controls}, and the ignored fields' notes."""
    out: dict[str, BatcherControls] = {}
    notes: list[str] = []
    for v in values:
        name, sep, spec = v.partition("=")
        if not sep or not name.strip() or any(c in name for c in " :{}"):
            name, spec = ALL, v
        where = f"--dynamic-batching {v!r}"
        if name in out:
            raise InputError(f"{where}: {'every model' if name == ALL else name} is given twice")
        text = read_text(spec[1:], "dynamic_batching file") if spec.startswith("@") else spec
        controls, ignored = parse_dynamic_batching(text, where)
        out[name] = controls
        if ignored:
            notes.append(f"{where}: {', '.join(ignored)} ignored (the sidecar forms batches by the plan)")
    return out, notes


def controls_for(models: Iterable[str], given: dict[str, BatcherControls]) -> dict[str, BatcherControls]:
    """Each planned model's controls (its own, else the ones for every model); an unknown model is an error."""
    names = list(models)
    unknown = [n for n in given if n != ALL and n not in names]
    if unknown:
        raise InputError(f"--dynamic-batching {unknown[0]}=...: no planned model {unknown[0]!r} (the plan has "
                         f"{', '.join(names)})")
    return {n: given[n] if n in given else given[ALL] for n in names if n in given or ALL in given}
