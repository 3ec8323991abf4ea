"""Greedy decoding and exact-match accuracy (``docs/method.md``, "The four tasks").

The answer is decoded greedily after the prompt (through ``=``) until a newline or
``task.max_answer_len + 1`` tokens; a prediction is correct only if the whole answer matches.
Prompts are grouped by length so each group decodes as one unpadded batch (NoPE with causal
attention: padding on the left would change the activations, so none is used).
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from nope_interp.checks import in_order, is_int, is_real
from nope_interp.errors import NopeInterpError
from nope_interp.fast_forward import attached_hooks, fast_logits, unsupported_reason
from nope_interp.model import check_model_dtype, check_model_for_task, check_tokens, evaluates
from tasks import EOS, Batch, Example, Task, TaskError, UnknownCharacterError, decode, encode


@evaluates
@torch.inference_mode()
def greedy_decode(
    model: HookedTransformer, prompt_tokens: Int[Tensor, "batch pos"], max_new_tokens: int
) -> Int[Tensor, "batch new"]:
    """Append ``max_new_tokens`` argmax tokens to each prompt (no early stop; caller cuts at newline).

    Raises:
        NopeInterpError: ``prompt_tokens`` is not a 2-D batch of at least one sequence of at least one
            token id in ``[0, d_vocab)``; ``max_new_tokens`` is not an integer >= 0; prompt plus new
            tokens would exceed the model's ``n_ctx``.
    """
    check_model_dtype(model, "greedy_decode")
    prompt_tokens = check_tokens(model, prompt_tokens, "prompt_tokens")
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise NopeInterpError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    n_ctx = model.cfg.n_ctx
    if prompt_tokens.shape[1] + max_new_tokens > n_ctx:
        raise NopeInterpError(
            f"n_ctx={n_ctx} is too small: prompts of {prompt_tokens.shape[1]} tokens plus "
            f"{max_new_tokens} answer tokens need n_ctx >= {prompt_tokens.shape[1] + max_new_tokens}"
        )
    tokens = prompt_tokens.to(model.cfg.device)
    if max_new_tokens > 0 and kv_cache_unsupported(model) is None:
        return _cached_greedy_decode(model, tokens, max_new_tokens).cpu()
    for _ in range(max_new_tokens):
        logits = model(tokens, return_type="logits")
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompt_tokens.shape[1] :].cpu()


def kv_cache_unsupported(model: HookedTransformer) -> str | None:
    """Why :func:`greedy_decode` recomputes the whole sequence for every new token instead of caching past
    keys and values (TransformerLens's ``TransformerLensKeyValueCache``), or None when it caches: hooks
    attached to the model (a hook on a cached forward sees one position at a time), training mode (dropout
    acts), local (sliding-window) or non-causal attention (with bidirectional attention, earlier positions
    change as tokens are added: a cache would be wrong). Where it caches, both paths give the same tokens
    (tested), the logits equal up to float rounding; the cached one does about ``pos`` times less work per
    token."""
    if not isinstance(model, HookedTransformer):
        return f"a {type(model).__name__} (only HookedTransformer)"
    if model.training:
        return "training mode"
    hooked_at = attached_hooks(model)
    if hooked_at:
        return f"hooks attached at {', '.join(hooked_at[:3])}{', ...' if len(hooked_at) > 3 else ''}"
    if getattr(model.cfg, "use_local_attn", False) or getattr(model.cfg, "attn_types", None):
        return "local attention"
    if model.cfg.attention_dir != "causal":  # earlier positions' keys and values change as tokens are added
        return f"{model.cfg.attention_dir} attention"
    return None


def _cached_greedy_decode(model: HookedTransformer, tokens: Int[Tensor, "batch pos"],
                          max_new_tokens: int) -> Int[Tensor, "batch new"]:
    """:func:`greedy_decode` with a key-value cache: the prompt once, then one position per new token."""
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    logits = model(tokens, return_type="logits", past_kv_cache=cache, attention_mask=torch.ones_like(tokens))
    new = []
    for i in range(max_new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        new.append(nxt)
        if i + 1 < max_new_tokens:
            logits = model(nxt, return_type="logits", past_kv_cache=cache, attention_mask=torch.ones_like(nxt))
    return torch.cat(new, dim=1)


@evaluates
def predict(model: HookedTransformer, task: Task, prompts: Sequence[str], batch_size: int = 1024,
            prefix: str = "") -> list[str]:
    """The model's greedy answer to each prompt (text before the first newline).

    Args:
        prompts: the prompts (a sequence of strings, not one string), each non-empty and made of
            vocabulary characters.
        batch_size: prompts per forward pass (>= 1).
        prefix: text put before every prompt (``"\\n"`` for a model trained on packed windows, where
            every example follows a newline); not part of the answer.

    Raises:
        NopeInterpError: ``prompts`` is a single string, a set or frozenset (the answers follow its order:
            :func:`~nope_interp.checks.in_order`; a generator is read once: before, it raised a TypeError); a
            prompt that is not a string, is empty (with no ``prefix``) or holds a character outside the
            vocabulary (the message gives its index);
            ``batch_size`` < 1; prompts that do not fit the model's ``n_ctx``; a model that cannot read the
            task's inputs (:func:`nope_interp.model.check_model_for_task`: ``task`` a string, ``d_vocab`` too
            small, ``model.half()``).
    """
    check_model_for_task(model, task, None, "predict")
    if isinstance(prompts, (str, bytes)):
        raise NopeInterpError(f"prompts must be a sequence of prompt strings, got the single string {prompts!r} "
                              f"(write [{prompts!r}] for one prompt)")
    prompts = in_order("prompts", prompts, "prompt strings", "predict")  # read once: encoded, then counted
    if not is_int(batch_size) or batch_size < 1:
        raise NopeInterpError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    batch_size = int(batch_size)
    if not isinstance(prefix, str):
        raise NopeInterpError(f"prefix must be a string, got {type(prefix).__name__} {prefix!r}")
    encoded: list[list[int]] = []
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise NopeInterpError(f"prompts[{i}] must be a string, got {type(p).__name__} {p!r}")
        if not prefix + p:
            raise NopeInterpError(f"prompts[{i}] is empty: a prompt needs at least one character (e.g. '$1+2=')")
        try:
            encoded.append(encode(prefix + p))
        except UnknownCharacterError as err:
            raise NopeInterpError(f"prompts[{i}]: {err}") from None
    groups: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(encoded):
        groups[len(ids)].append(i)
    out: list[str] = [""] * len(prompts)
    for idx in groups.values():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            toks = torch.tensor([encoded[i] for i in chunk], dtype=torch.long)
            new = greedy_decode(model, toks, task.max_answer_len + 1)
            for i, row in zip(chunk, new, strict=True):
                out[i] = decode(row).split(EOS)[0]
    return out


@evaluates
def exact_match_accuracy(
    model: HookedTransformer, task: Task, examples: Sequence[Example], batch_size: int = 1024, prefix: str = ""
) -> float:
    """Fraction in [0, 1] of ``examples`` whose greedy answer equals the whole answer (``prefix`` as in
    :func:`predict`).

    Raises:
        NopeInterpError: ``examples`` not a non-empty sequence of ``tasks.Example`` with non-empty string
            prompts and answers (an empty answer would count as right whenever the model stops at once); an
            answer no greedy answer can equal: one holding a newline or a character outside the vocabulary,
            or longer than ``task.max_answer_len`` (what :func:`predict` generates); bad prompts and models as
            in :func:`predict`.
    """
    examples = _checked_examples(examples, "exact_match_accuracy")
    check_model_for_task(model, task, None, "exact_match_accuracy")
    for i, ex in enumerate(examples):
        try:
            encode(ex.answer)
        except UnknownCharacterError as err:
            raise NopeInterpError(f"examples[{i}].answer: {err}") from None
        if len(ex.answer) > task.max_answer_len:
            raise NopeInterpError(f"examples[{i}].answer has {len(ex.answer)} characters, more than the "
                                  f"{task.max_answer_len} of {task.name!r} answers that predict generates: it could "
                                  "never match (pass the task the examples belong to)")
    preds = predict(model, task, [ex.prompt for ex in examples], batch_size, prefix)
    return sum(p == ex.answer for p, ex in zip(preds, examples, strict=True)) / len(examples)


def answer_loss(model: HookedTransformer, batch: Batch, fast: bool = False) -> Float[Tensor, ""]:
    """Mean cross-entropy (nats, >= 0) over the positions of ``batch.loss_mask``, teacher-forced: the
    answer tokens (answer-only objective) or every position (packed objective). The training objective,
    and the loss ablations report. Unlike the measuring functions of this module it runs the model in the
    mode it is in, with gradients (the trainer calls it in train mode): a model with dropout left in train
    mode gives a different loss on each call; measure under :func:`nope_interp.model.eval_mode` or after
    ``model.eval()``.

    Args:
        fast: compute the logits with the trainer's hook-free forward
            (:func:`nope_interp.fast_forward.fast_logits`; equal up to float rounding; user hooks are not
            run) when the model supports it; otherwise with ``model(tokens)``.

    Raises:
        NopeInterpError: ``batch`` not a ``tasks.Batch``; ``batch.tokens``, or ``batch.targets`` where
            ``batch.loss_mask`` is True, are not integer ids in ``[0, d_vocab)``
            (:func:`~nope_interp.model.check_tokens`); more positions than the model's ``n_ctx``;
            ``targets`` or ``loss_mask`` not of the tokens' shape; a ``loss_mask`` that is not boolean (0/1
            integers are read as booleans) or selects no position (the mean of nothing: NaN); weights
            converted with ``model.half()`` (:func:`~nope_interp.model.check_model_dtype`).
    """
    if not isinstance(batch, Batch):
        raise NopeInterpError(f"batch must be a tasks.Batch(tokens, targets, loss_mask), got {type(batch).__name__}")
    check_model_dtype(model, "answer_loss")
    check_tokens(model, batch.tokens, "batch.tokens")
    if batch.tokens.shape[1] > model.cfg.n_ctx:
        raise NopeInterpError(f"batch.tokens has {batch.tokens.shape[1]} positions, more than the model's "
                              f"n_ctx={model.cfg.n_ctx}")
    for name in ("targets", "loss_mask"):
        value = getattr(batch, name)
        if not isinstance(value, Tensor) or value.shape != batch.tokens.shape:
            raise NopeInterpError(f"batch.{name} must be a tensor of the tokens' shape {tuple(batch.tokens.shape)}, "
                                  f"got {tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}")
    mask = batch.loss_mask
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or mask.dtype.is_complex or not bool(((mask == 0) | (mask == 1)).all()):
            raise NopeInterpError(f"batch.loss_mask must be boolean (or 0/1 integers), got dtype {mask.dtype}")
        mask = mask.bool()
    if not bool(mask.any()):
        raise NopeInterpError("batch.loss_mask selects no position: there is no loss to average")
    check_tokens(model, batch.targets[mask].unsqueeze(0), "batch.targets[loss_mask]")
    device = model.cfg.device
    tokens = batch.tokens.to(device)
    if fast and unsupported_reason(model) is None:
        logits = fast_logits(model, tokens)
    else:
        logits = model(tokens, return_type="logits")
    mask = mask.to(device)
    return F.cross_entropy(logits[mask], batch.targets.to(device)[mask].long())  # int8 / int32 ids too



def _checked_examples(examples: object, fn: str) -> list[Example]:
    """``examples`` as a list of :class:`~tasks.Example` with string fields, a non-empty answer without a
    newline, and a non-empty prompt; else one-line :class:`NopeInterpError` naming ``fn`` and the index."""
    if isinstance(examples, (str, bytes, Example)) or not isinstance(examples, Sequence):
        raise NopeInterpError(f"{fn} needs a non-empty sequence (a list) of tasks.Example, got "
                              f"{type(examples).__name__} {examples!r}"[:300])
    examples = list(examples)
    if not examples:
        raise NopeInterpError(f"{fn} needs a non-empty sequence of tasks.Example, got an empty one")
    for i, ex in enumerate(examples):
        if not isinstance(ex, Example):
            raise NopeInterpError(f"examples[{i}] must be a tasks.Example (e.g. task.example(prompt)), "
                                  f"got {type(ex).__name__} {ex!r}"[:300])
        for name in ("prompt", "answer"):
            value = getattr(ex, name)
            if not isinstance(value, str) or not value:
                raise NopeInterpError(f"examples[{i}].{name} must be a non-empty string, got {value!r}"[:300])
        if EOS in ex.answer:
            raise NopeInterpError(f"examples[{i}].answer holds a newline ({ex.answer!r}): an answer ends before it")
    return examples


@evaluates
@torch.inference_mode()
def answer_token_loss(
    model: HookedTransformer, task: Task, examples: Sequence[Example], batch_size: int = 1024, prefix: str = ""
) -> float:
    """Teacher-forced cross-entropy (nats per answer character, >= 0) of ``examples``' answers: the mean over
    every answer character of ``-log p(that character)``, given ``prefix`` (as in :func:`predict`), the
    prompt and the answer's earlier characters. The newline that ends an answer is not scored.

    Exact match moves only once greedy answers come out right; this falls as soon as the model puts more
    probability on the right answers, so it shows whether a run at chance accuracy is learning anything.
    Compare it with the entropy of the answers' own distribution: a model that ignores the prompt and
    predicts that distribution scores exactly it (2.09 nats on the 9-digit indexing task; its answers are
    one character). Logged as ``eval_answer_loss`` in a training run's ``metrics.jsonl`` (README, "From the
    command line"). Lines are grouped by length, so no padding enters the model (any attention).

    Raises:
        NopeInterpError: ``examples`` not a non-empty sequence of ``tasks.Example`` with non-empty string
            prompts and answers (an answer holding a newline included); characters outside the vocabulary;
            ``batch_size`` < 1; ``prefix`` not a string; inputs longer than the model's ``n_ctx``; a model that
            cannot read the task (:func:`~nope_interp.model.check_model_for_task`).
    """
    check_model_for_task(model, task, None, "answer_token_loss")
    examples = _checked_examples(examples, "answer_token_loss")
    if not is_int(batch_size) or batch_size < 1:
        raise NopeInterpError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    batch_size = int(batch_size)
    if not isinstance(prefix, str):
        raise NopeInterpError(f"prefix must be a string, got {type(prefix).__name__} {prefix!r}")
    groups: dict[tuple[int, int], list[list[int]]] = defaultdict(list)  # (length, first answer index) -> ids
    for i, ex in enumerate(examples):
        try:
            ids = encode(prefix + ex.prompt + ex.answer)
        except UnknownCharacterError as err:
            raise NopeInterpError(f"examples[{i}] with prefix {prefix!r}: {err}") from None
        if len(ids) - 1 > model.cfg.n_ctx:
            raise NopeInterpError(f"examples[{i}] with prefix {prefix!r} needs {len(ids) - 1} positions, more than "
                                  f"the model's n_ctx={model.cfg.n_ctx}")
        groups[(len(ids), len(prefix) + len(ex.prompt))].append(ids)
    total, count = 0.0, 0
    for (_, first), rows in groups.items():
        for start in range(0, len(rows), batch_size):
            ids = torch.tensor(rows[start : start + batch_size], dtype=torch.long)
            # position t predicts ids[t + 1]; the answer's characters are ids[first:]
            logits = model(ids[:, :-1].to(model.cfg.device), return_type="logits")[:, first - 1 :]
            targets = ids[:, first:].to(logits.device)
            total += float(F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum"))
            count += targets.numel()
    return total / count


@dataclass(frozen=True)
class InputsExactMatch:
    """A model's greedy exact match on the prompts inside a set of analysis inputs (:func:`exact_match_on_inputs`).

    Attributes:
        exact_match: fraction in [0, 1] of the scorable inputs answered exactly; None when none is scorable.
        n_scored: inputs scored. n_inputs: inputs given (the rest hold no complete prompt that fits n_ctx).
    """

    exact_match: float | None
    n_scored: int
    n_inputs: int

    def to_dict(self) -> dict[str, float | int | None]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return {"exact_match": self.exact_match, "n_scored": self.n_scored, "n_inputs": self.n_inputs}


def prompt_in_input(task: Task, text: str, max_context: int | None = None) -> tuple[str, str] | None:
    """The last complete prompt of ``task`` in an analysis input: ``(context, prompt)``, where ``context`` is
    ``text`` up to and including that prompt's last character (everything the model reads before answering:
    leading newlines, earlier examples) and ``prompt`` the prompt alone, the text between the newline before
    it (or the start) and its end. None when ``text`` holds no complete prompt (an input cut before its ``=``),
    or none whose context is at most ``max_context`` characters (None: any length).

    A full-length prompt is its own context; an input of the ``authors`` protocol is its left padding plus
    the prompt (any answer characters after it are dropped); a ``window`` input is every earlier line plus
    the last prompt whose end it holds. Linear in ``len(text)``: only candidates no longer than the task's
    longest prompt are parsed.

    Raises:
        NopeInterpError: ``task`` not a ``tasks.Task``; ``text`` not a string; ``max_context`` not None or an
            integer >= 1.
    """
    if not isinstance(task, Task):
        raise NopeInterpError(f"task must be a tasks.Task (e.g. tasks.get_task('reversal')), got "
                              f"{type(task).__name__} {task!r}"[:200])
    if not isinstance(text, str):
        raise NopeInterpError(f"text must be a string (one analysis input), got {type(text).__name__}")
    if max_context is not None and (not is_int(max_context) or max_context < 1):
        raise NopeInterpError(f"max_context must be None or an integer >= 1, got {max_context!r}")
    end = len(text) if max_context is None else min(len(text), max_context)
    while (end := text.rfind("=", 0, end)) >= 0:
        start = text.rfind(EOS, 0, end) + 1
        if end + 1 - start > task.max_prompt_len:  # longer than any prompt: not one
            continue
        try:
            task.solve(text[start : end + 1])
        except TaskError:
            continue
        return text[: end + 1], text[start : end + 1]
    return None


#: How far below its test exact match a model's exact match on the analysed inputs may fall before the scores
#: measured on those inputs are flagged as off its distribution (:func:`off_distribution`).
OFF_DISTRIBUTION_MARGIN = 0.1


def off_distribution(on_inputs: float | None, test_acc: float | None,
                     margin: float = OFF_DISTRIBUTION_MARGIN) -> bool:
    """Whether scores measured on some analysis inputs are off the model's distribution: its greedy exact match
    on those very inputs (:func:`exact_match_on_inputs`, a fraction in [0, 1]) is more than ``margin`` below its
    exact match on the held-out test prompts (``test_acc``, in [0, 1]), e.g. a model trained on single prompts
    read with padding it never saw, or a packed model asked late in a window it has not learned to answer
    there. False when either is unknown (None or NaN): nothing to compare. Defined in ``docs/method.md``,
    "Definitions" (the exact match on the analysed inputs). Raises nothing."""
    known = [v for v in (on_inputs, test_acc) if is_real(v) and v == v]  # a bool is not a fraction here
    return len(known) == 2 and on_inputs < test_acc - margin  # type: ignore[operator]


@evaluates
def exact_match_on_inputs(model: HookedTransformer, task: Task, inputs: Sequence[str],
                          batch_size: int = 1024) -> InputsExactMatch:
    """Greedy exact match of ``model`` on the very inputs an analysis reads (``tasks.protocol_inputs``): for
    each input, the answer decoded after the context of its last complete prompt (:func:`prompt_in_input`),
    against the task's solution. A score measured on inputs that the model cannot answer (padding or earlier
    examples that a model trained on single unpadded prompts never saw) is measured off its distribution:
    this says so. Inputs without a complete prompt, or whose context and answer would not fit ``n_ctx``,
    are not scored (counted in ``n_inputs`` only). Defined in ``docs/method.md``, "Definitions".

    Raises:
        NopeInterpError: ``inputs`` empty, a single string or holding a non-string; a model that cannot read
            the task (:func:`~nope_interp.model.check_model_for_task`); characters outside the vocabulary in a
            scored context (the input's index is named); ``batch_size`` < 1.
    """
    check_model_for_task(model, task, None, "exact_match_on_inputs")
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise NopeInterpError(f"inputs must be a sequence of input strings, got {type(inputs).__name__} "
                              f"{inputs!r}"[:200])
    if not inputs:
        raise NopeInterpError("exact_match_on_inputs needs a non-empty sequence of input strings, got an empty one")
    bad = next((i for i, t in enumerate(inputs) if not isinstance(t, str)), None)
    if bad is not None:
        raise NopeInterpError(f"inputs[{bad}] must be a string, got {type(inputs[bad]).__name__}")
    if not is_int(batch_size) or batch_size < 1:
        raise NopeInterpError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    batch_size = int(batch_size)
    room = model.cfg.n_ctx - task.max_answer_len - 1
    scored: list[tuple[str, str]] = []
    for i, text in enumerate(inputs):
        found = prompt_in_input(task, text, max_context=room) if room >= 1 else None
        if found is None:
            continue
        try:
            encode(found[0])
        except UnknownCharacterError as err:
            raise NopeInterpError(f"inputs[{i}]: {err}") from None
        scored.append((found[0], task.solve(found[1])))
    if not scored:
        return InputsExactMatch(exact_match=None, n_scored=0, n_inputs=len(inputs))
    preds = predict(model, task, [ctx for ctx, _ in scored], batch_size)
    right = sum(p == answer for p, (_, answer) in zip(preds, scored, strict=True))
    return InputsExactMatch(exact_match=right / len(scored), n_scored=len(scored), n_inputs=len(inputs))
