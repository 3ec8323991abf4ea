"""The paper's four synthetic tasks (Zuo et al., COLING 2025): pure Python + torch tensors, no model code.

Use :func:`get_task` with a name from :data:`TASK_NAMES`; see :mod:`tasks.base` for the interface.
"""

import numbers

from tasks.addition import AdditionTask
from tasks.base import (
    AUTHORS_LENGTH,
    DEFAULT_WINDOW,
    PROTOCOLS,
    Batch,
    Example,
    Splits,
    Task,
    TaskError,
    authors_inputs,
    authors_length,
    held_out_lines,
    packed_batch,
    packed_stream,
    protocol_examples,
    protocol_inputs,
    protocol_length,
    window_inputs,
)
from tasks.indexing import IndexingTask
from tasks.ordering import OrderingTask
from tasks.reversal import ReversalTask
from tasks.vocab import D_VOCAB, EOS, VOCAB, UnknownCharacterError, decode, encode

_REGISTRY: dict[str, type[Task]] = {
    cls.name: cls for cls in (AdditionTask, ReversalTask, IndexingTask, OrderingTask)
}
#: The available task names, in the paper's order.
TASK_NAMES: tuple[str, ...] = ("addition", "reversal", "indexing", "ordering")


def get_task(name: str, **params: object) -> Task:
    """Build a task by name with the paper's parameters unless overridden (e.g. ``n_digits=4``).

    Raises:
        TaskError: unknown task name or parameter, or an invalid value; the message names both the
            offending parameter and the allowed values.
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        raise TaskError(f"unknown task {name!r}; available tasks: {', '.join(TASK_NAMES)}")
    cls = _REGISTRY[name]
    allowed = [f for f in cls.__dataclass_fields__ if not f.startswith("_")]
    for key in params:
        if key not in allowed:
            raise TaskError(f"unknown parameter {key!r} for task {name!r}; allowed: {', '.join(allowed)}")
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy integers too
            raise TaskError(f"{key} must be an integer, got {value!r}")
    return cls(**{k: int(v) for k, v in params.items()})


__all__ = [
    "TASK_NAMES", "get_task", "Task", "TaskError", "Example", "Splits", "Batch", "packed_stream", "packed_batch",
    "PROTOCOLS", "DEFAULT_WINDOW", "AUTHORS_LENGTH", "authors_length", "authors_inputs", "window_inputs",
    "held_out_lines", "protocol_examples", "protocol_inputs", "protocol_length",
    "AdditionTask", "ReversalTask", "IndexingTask", "OrderingTask",
    "VOCAB", "D_VOCAB", "EOS", "encode", "decode", "UnknownCharacterError",
]
