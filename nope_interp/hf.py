"""Hugging Face models in the toolkit: wrap one in a TransformerLens ``TransformerBridge`` (offline).

The optional extra ``.[hf]`` (``transformers``); nothing else in the package imports this module, and it
imports ``transformers`` only inside its functions. The bridge's hook names match ``HookedTransformer``'s
(``hook_embed``, ``blocks.L.hook_resid_pre/mid/post``, ``blocks.L.attn.hook_z``, ...), so every
token-level analysis (:func:`nope_interp.analysis.analyze_tokens`, ``nope-interp long-context --hf-path``)
runs on it unchanged; :func:`nope_interp.positional.layer_positional_types` says which layers are NoPE.

The HF model is built or loaded with eager attention, so the attention pattern is computed (and hooked)
explicitly. :func:`tiny_hf_model` builds small randomly initialised models locally (no download) for tests
and examples: SmolLM3 with every layer NoPE or with RoPE left out of every fourth layer, and Llama (RoPE
everywhere).
"""

from pathlib import Path
from typing import Any

import torch

from nope_interp.checks import is_int
from nope_interp.config import check_int
from nope_interp.errors import NopeInterpError, one_line

#: The Hugging Face config fields that say which layers attend through a sliding window, and how wide:
#: copied onto the bridge's config, where :func:`nope_interp.averaging.attention_window` reads them (before,
#: a Mistral bridge's window was unknown to the toolkit: entropies normalised over every earlier key, and
#: the uniform-attention intervention let in keys outside the window).
SLIDING_WINDOW_FIELDS = ("sliding_window", "use_sliding_window", "layer_types")

#: The tiny models :func:`tiny_hf_model` builds.
TINY_KINDS = ("smollm3-mixed", "smollm3-nope", "llama")


def bridge_from_hf(hf_model: torch.nn.Module, architecture: str | None = None) -> Any:
    """A ``TransformerBridge`` around an already-built Hugging Face causal LM (eval mode, same weights).

    The bridge runs ``hf_model``'s own modules, so ``hf_model`` is put in eval mode too (one set of modules
    has one mode); call ``hf_model.train()`` after it to train the Hugging Face model. Its sliding window, if
    any (:data:`SLIDING_WINDOW_FIELDS`), is copied onto ``bridge.cfg`` so that the analyses know which keys
    each query may see.

    Uses TransformerLens's loader-agnostic builder
    (``transformer_lens.model_bridge.sources._bridge_builder.build_bridge_from_module``), so nothing is
    downloaded. ``architecture`` defaults to ``hf_model.config.architectures[0]`` or the class name.

    Raises:
        NopeInterpError: not a Hugging Face model (no ``config``); an architecture TransformerLens does not
            support (its message, on one line).
    """
    config = getattr(hf_model, "config", None)
    if config is None:
        raise NopeInterpError(f"bridge_from_hf needs a Hugging Face model with a .config, got "
                              f"{type(hf_model).__name__}")
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    arch = architecture or (getattr(config, "architectures", None) or [type(hf_model).__name__])[0]
    try:
        bridge = build_bridge_from_module(hf_model.eval(), arch, hf_config=config, tokenizer=None)
    except Exception as err:
        raise NopeInterpError(f"TransformerLens cannot wrap {arch}: {one_line(str(err))[:300]}") from None
    for field in SLIDING_WINDOW_FIELDS:  # the window, read by nope_interp.averaging.attention_window
        if getattr(config, field, None) is not None:
            setattr(bridge.cfg, field, getattr(config, field))
    return bridge.eval() if hasattr(bridge, "eval") else bridge


def load_hf(path: str | Path, what: str = "path") -> Any:
    """Load a causal LM saved with ``save_pretrained`` in ``path`` (eager attention, CPU, offline) and wrap it
    (:func:`bridge_from_hf`).

    Args:
        path: the folder (``~`` is expanded). what: how errors name it (``"path"``; the analysis jobs pass
            ``"hf_path"``, which the CLI spells ``--hf-path``).

    Raises:
        NopeInterpError: ``path`` is not a path, or not a folder with a ``config.json``; the weights cannot be
            loaded.
    """
    from nope_interp.io import as_path

    path = as_path(path, what)
    if not (path / "config.json").is_file():
        raise NopeInterpError(f"{what} {path} is not a folder saved by save_pretrained (no config.json)")
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", local_files_only=True)
    except Exception as err:
        raise NopeInterpError(f"cannot load the Hugging Face model in {path}: {one_line(str(err))[:300]}") \
            from None
    return bridge_from_hf(model)


def load_hf_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved beside a model in ``path`` (``tokenizer.save_pretrained``; offline), for
    :func:`nope_interp.analysis.analyze_text`.

    Raises:
        NopeInterpError: ``path`` is not a path; no tokenizer can be loaded from it (the message says how to
            save one).
    """
    from transformers import AutoTokenizer

    from nope_interp.io import as_path

    path = as_path(path, "path")
    try:
        return AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    except Exception as err:
        raise NopeInterpError(f"no tokenizer in {path} ({one_line(str(err))[:200]}): save the model's "
                              "tokenizer there with tokenizer.save_pretrained(DIR)") from None


def tiny_hf_model(kind: str = "smollm3-mixed", seed: int = 0, n_layers: int = 4, d_model: int = 64,
                  vocab: int = 128, n_ctx: int = 512) -> torch.nn.Module:
    """A small randomly initialised Hugging Face causal LM (eager attention, eval mode), built locally.

    ``smollm3-mixed``: SmolLM3 with RoPE in every layer but every fourth (``no_rope_layers[i] == 0`` for
    i = 3, 7, ...: in SmolLM3's config 1 means the layer USES RoPE); ``smollm3-nope``: no RoPE in any layer;
    ``llama``: Llama, RoPE in every layer. 4 heads, 2 key/value heads (grouped-query attention). The weights
    are drawn from ``seed``; the global torch RNG is left as it was.

    Raises:
        NopeInterpError: an unknown kind; ``seed`` not an integer >= 0; ``n_layers``, ``vocab`` or ``n_ctx``
            not an integer >= 1 (``vocab`` >= 3: it holds the pad, bos and eos ids); ``d_model`` not a
            multiple of 8 (4 heads of an even width, as rotary embeddings need).
    """
    if kind not in TINY_KINDS:
        raise NopeInterpError(f"unknown tiny model {kind!r}; allowed: {', '.join(TINY_KINDS)}")
    # as ints (a numpy integer is accepted): the transformers config is written as JSON
    seed, n_layers, vocab, n_ctx, d_model = (
        check_int(name, value, low, 2**63 - 1)
        for name, value, low in (("seed", seed, 0), ("n_layers", n_layers, 1), ("vocab", vocab, 3),
                                 ("n_ctx", n_ctx, 1), ("d_model", d_model, 8)))
    common = dict(vocab_size=vocab, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=n_ctx, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    if d_model % 8:
        raise NopeInterpError(f"d_model must be a multiple of 8 (4 heads of an even width), got {d_model}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            return LlamaForCausalLM(LlamaConfig(**common)).eval()
        from transformers import SmolLM3Config, SmolLM3ForCausalLM

        uses_rope = [0 if kind == "smollm3-nope" or (i + 1) % 4 == 0 else 1 for i in range(n_layers)]
        return SmolLM3ForCausalLM(SmolLM3Config(no_rope_layers=uses_rope, **common)).eval()


def expected_layer_types(hf_model: torch.nn.Module) -> tuple[str, ...]:
    """The per-layer types a Hugging Face config claims (for checking :func:`layer_positional_types`):
    SmolLM3 ``no_rope_layers`` (1 = RoPE, 0 = NoPE); any other model with ``rope_theta`` or
    ``rope_parameters`` is RoPE in every layer.

    Raises:
        NopeInterpError: ``hf_model`` has no ``config`` (not a Hugging Face model) or its config no integer
            ``num_hidden_layers``; a config that says neither.
    """
    cfg = getattr(hf_model, "config", None)
    if cfg is None:
        raise NopeInterpError(f"expected_layer_types needs a Hugging Face model (a transformers PreTrainedModel with "
                              f"a .config), got {type(hf_model).__name__}")
    n = getattr(cfg, "num_hidden_layers", None)
    if not is_int(n) or n < 0:
        raise NopeInterpError(f"expected_layer_types: the config of {type(hf_model).__name__} has no integer "
                              f"num_hidden_layers (got {n!r}); expected a Hugging Face causal LM's config")
    flags = getattr(cfg, "no_rope_layers", None)
    if flags is not None:
        return tuple("rope" if f else "nope" for f in flags[:n])
    if getattr(cfg, "rope_theta", None) is not None or getattr(cfg, "rope_parameters", None) is not None:
        return ("rope",) * n
    raise NopeInterpError(f"cannot tell the positional scheme of {type(hf_model).__name__} from its config")
