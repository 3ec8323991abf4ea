"""The character vocabulary shared by all four tasks.

Source: the authors' research code (``docs/method.md``, "The four tasks"): 96 printable characters (letters,
digits, punctuation, space, newline); no BOS/EOS token; a newline ends an example.
"""

import operator
import string

import torch
from jaxtyping import Int
from torch import Tensor

#: The 96 characters, in token-id order: newline, space, digits, lowercase, uppercase, punctuation.
VOCAB: str = "\n " + string.digits + string.ascii_lowercase + string.ascii_uppercase + string.punctuation
#: Vocabulary size (``d_vocab`` of every model trained on these tasks).
D_VOCAB: int = len(VOCAB)
#: The end-of-example character; also used to right-pad batches (padded targets are masked out).
EOS: str = "\n"

_STOI = {ch: i for i, ch in enumerate(VOCAB)}
assert D_VOCAB == 96 and len(_STOI) == 96


class UnknownCharacterError(ValueError):
    """A string holds a character that is not in :data:`VOCAB`."""


def encode(text: str) -> list[int]:
    """Map a string to token ids (one per character).

    Raises:
        UnknownCharacterError: naming the first character (and its position) not in the vocabulary.
    """
    out = []
    for i, ch in enumerate(text):
        try:
            out.append(_STOI[ch])
        except KeyError:
            raise UnknownCharacterError(
                f"character {ch!r} at index {i} of {text!r} is not in the vocabulary "
                f"(allowed: printable ASCII letters, digits, punctuation, space, newline)"
            ) from None
    return out


def encode_tensor(text: str) -> Int[Tensor, " pos"]:
    """Like :func:`encode`, as a ``torch.long`` tensor of shape ``(len(text),)``."""
    return torch.tensor(encode(text), dtype=torch.long)


def decode(ids: list[int] | Int[Tensor, " pos"]) -> str:
    """Map token ids back to a string; inverse of :func:`encode`.

    Raises:
        ValueError: if an id is outside ``[0, D_VOCAB)`` or is not an integer (a string such as ``"3"``
            is refused, not read with ``int``, which would also read other scripts' digits); if ``ids`` is
            a tensor that is not 1-D.
    """
    if isinstance(ids, Tensor):
        if ids.ndim != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"ids must be a 1-D integer tensor, got shape {tuple(ids.shape)} and dtype {ids.dtype}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)):
        raise ValueError(f"ids must be a sequence of integer token ids, got the string {ids!r}")
    chars = []
    for i in ids:
        try:
            if isinstance(i, bool):
                raise TypeError
            index = operator.index(i)  # ints and numpy integers; not str, float or bool
        except TypeError:
            raise ValueError(f"token ids must be integers, got {type(i).__name__} {i!r}") from None
        if not 0 <= index < D_VOCAB:
            raise ValueError(f"token id {i!r} is outside the vocabulary range [0, {D_VOCAB})")
        chars.append(VOCAB[index])
    return "".join(chars)
