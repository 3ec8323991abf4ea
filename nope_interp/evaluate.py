"""Greedy decoding and exact-match accuracy (``docs/method.md``, "The four tasks").

The answer is decoded greedily after the prompt (through ``=``) until a newline or
``task.max_answer_len + 1`` tokens; a prediction is correct only if the whole answer matches.
Prompts are grouped by length so each group decodes as one unpadded batch (NoPE with causal
attention: padding on the left would change the activations, so none is used).
"""

from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from nope_interp.errors import NopeInterpError
from tasks import EOS, Batch, Example, Task, decode, encode


@torch.inference_mode()
def greedy_decode(
    model: HookedTransformer, prompt_tokens: Int[Tensor, "batch pos"], max_new_tokens: int
) -> Int[Tensor, "batch new"]:
    """Append ``max_new_tokens`` argmax tokens to each prompt (no early stop; caller cuts at newline).

    Raises:
        NopeInterpError: if prompt plus new tokens would exceed the model's ``n_ctx``.
    """
    n_ctx = model.cfg.n_ctx
    if prompt_tokens.shape[1] + max_new_tokens > n_ctx:
        raise NopeInterpError(
            f"n_ctx={n_ctx} is too small: prompts of {prompt_tokens.shape[1]} tokens plus "
            f"{max_new_tokens} answer tokens need n_ctx >= {prompt_tokens.shape[1] + max_new_tokens}"
        )
    tokens = prompt_tokens.to(model.cfg.device)
    for _ in range(max_new_tokens):
        logits = model(tokens, return_type="logits")
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompt_tokens.shape[1] :].cpu()


def predict(model: HookedTransformer, task: Task, prompts: Sequence[str], batch_size: int = 1024,
            prefix: str = "") -> list[str]:
    """The model's greedy answer to each prompt (text before the first newline).

    Args:
        prefix: text put before every prompt (``"\\n"`` for a model trained on packed windows, where
            every example follows a newline); not part of the answer.
    """
    groups: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[len(p)].append(i)
    out: list[str] = [""] * len(prompts)
    for idx in groups.values():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            toks = torch.tensor([encode(prefix + prompts[i]) for i in chunk], dtype=torch.long)
            new = greedy_decode(model, toks, task.max_answer_len + 1)
            for i, row in zip(chunk, new, strict=True):
                out[i] = decode(row).split(EOS)[0]
    return out


def exact_match_accuracy(
    model: HookedTransformer, task: Task, examples: Sequence[Example], batch_size: int = 1024, prefix: str = ""
) -> float:
    """Fraction in [0, 1] of ``examples`` whose greedy answer equals the whole answer (``prefix`` as in
    :func:`predict`).

    Raises:
        NopeInterpError: no examples; prompts that do not fit the model's ``n_ctx``.
    """
    if not examples:
        raise NopeInterpError("exact_match_accuracy needs at least one example")
    preds = predict(model, task, [ex.prompt for ex in examples], batch_size, prefix)
    return sum(p == ex.answer for p, ex in zip(preds, examples, strict=True)) / len(examples)


def answer_loss(model: HookedTransformer, batch: Batch) -> Float[Tensor, ""]:
    """Mean cross-entropy (nats, >= 0) over the answer tokens of ``batch`` (``batch.loss_mask``),
    teacher-forced. The training objective of the shipped models, and the loss ablations report."""
    device = model.cfg.device
    logits = model(batch.tokens.to(device), return_type="logits")
    mask = batch.loss_mask.to(device)
    return F.cross_entropy(logits[mask], batch.targets.to(device)[mask])
