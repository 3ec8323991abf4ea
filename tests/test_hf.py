"""Hugging Face models through TransformerBridge: equal logits, per-layer positional types measured (not read from
the config), the adjacency pipeline on a hybrid NoPE/RoPE model, and ``--hf-path`` from a folder on disk."""

import json
import re
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_models():
    from nope_interp.hf import TINY_KINDS, bridge_from_hf, tiny_hf_model

    out = {}
    for kind in TINY_KINDS:
        hf = tiny_hf_model(kind, seed=0)
        out[kind] = (hf, bridge_from_hf(hf))
    return out


def test_bridge_logits_equal_the_hf_model(tiny_models):
    tokens = torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    for kind, (hf, bridge) in tiny_models.items():
        with torch.no_grad():
            torch.testing.assert_close(bridge(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5, msg=kind)


def test_layer_types_are_measured_and_match_what_the_configs_mean(tiny_models):
    from nope_interp.hf import expected_layer_types
    from nope_interp.positional import layer_positional_types

    got = {kind: layer_positional_types(bridge) for kind, (_, bridge) in tiny_models.items()}
    assert got["smollm3-mixed"] == ("rope", "rope", "rope", "nope")  # no_rope_layers = [1, 1, 1, 0]: 1 USES RoPE
    assert got["smollm3-nope"] == ("nope",) * 4
    assert got["llama"] == ("rope",) * 4
    for kind, (hf, _) in tiny_models.items():
        assert got[kind] == expected_layer_types(hf)


def test_layer_types_of_hooked_transformers():
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model
    from nope_interp.positional import layer_positional_types

    assert layer_positional_types(build_model(preset("tiny"))) == ("nope", "nope")
    assert layer_positional_types(build_model(preset("tiny", positional="rotary"))) == ("rope", "rope")
    assert layer_positional_types(build_model(preset("tiny", positional="learned"))) == ("learned", "learned")
    rotary = build_model(preset("tiny", positional="rotary"))
    with pytest.raises(NopeInterpError, match="2 <= pos <= n_ctx"):
        layer_positional_types(rotary, torch.tensor([[5]]))
    # before: an absolute tolerance of 1e-6 called RoPE layers of small-weight models NoPE
    for std in (1e-5, 1e-3, 0.02, 1.0):
        assert layer_positional_types(build_model(preset("tiny", positional="rotary", init_std=std))) == \
            ("rope", "rope"), std
        assert layer_positional_types(build_model(preset("tiny", init_std=std))) == ("nope", "nope"), std
    # before: the default 8-token probe was refused by a model with a shorter context
    assert layer_positional_types(build_model(preset("tiny", positional="rotary", n_ctx=4))) == ("rope", "rope")
    zero = build_model(preset("tiny", positional="rotary"))
    torch.nn.init.zeros_(zero.blocks[0].attn.W_Q)
    with pytest.raises(NopeInterpError, match="layer 0's queries are all zero"):
        layer_positional_types(zero)
    with pytest.raises(NopeInterpError, match="TransformerLens model"):
        layer_positional_types(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kw", [{}, {"attention": "sliding", "window": 3}, {"attention": "bidirectional"},
                                {"n_layers": 3}])
def test_a_layer_that_attends_unevenly_to_identical_tokens_is_never_called_nope(kw):
    """An ALiBi model was ('nope', 'nope'): it has neither rotated queries nor a positional embedding, yet every
    layer sees position. NoPE layers (causal, sliding or bidirectional) stay nope; ALiBi is named; a position
    bias this function does not know (here a hook adding -0.5 x distance to layer 1's scores) is refused."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model
    from nope_interp.positional import layer_positional_types

    model = build_model(preset("tiny", **kw))
    n = model.cfg.n_layers
    assert layer_positional_types(model) == ("nope",) * n

    def distance_bias(scores, hook):
        q, k = scores.shape[-2:]
        return scores - 0.5 * (torch.arange(q)[:, None] - torch.arange(k)[None, :]).clamp(min=0)

    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_attn_scores", distance_bias)]):
        with pytest.raises(NopeInterpError, match="layer 1 has no rotation and no positional embedding, yet "
                                                  "attends unevenly"):
            layer_positional_types(model)
    alibi = HookedTransformer(HookedTransformerConfig(n_layers=n, d_model=32, n_ctx=16, d_head=8, n_heads=4,
                                                      d_vocab=20, act_fn="relu", positional_embedding_type="alibi"))
    assert layer_positional_types(alibi) == ("alibi",) * n


def test_adjacency_pipeline_runs_on_a_hybrid_bridge(tiny_models):
    from nope_interp.analysis import analyze_tokens
    from nope_interp.similarity import adjacency_scores_of_activations

    _, bridge = tiny_models["smollm3-mixed"]
    tokens = torch.randint(3, 128, (3, 40), generator=torch.Generator().manual_seed(1))
    res = analyze_tokens(bridge, tokens, ("z", "resid_post"), max_lag=8)  # auto: the hooked path for a bridge
    assert len(res.sites) == 8 and all(0 <= res.score(s).mean <= 1 for s in res.sites)
    _, cache = bridge.run_with_cache(tokens)  # independent: the bridge's own cache, scored directly
    z3 = cache["blocks.3.attn.hook_z"].reshape(3, 40, -1)
    expected = adjacency_scores_of_activations(z3)["row_mean"]
    torch.testing.assert_close(res.per_sequence["row_mean"][res.sites.index("blocks.3.attn.hook_z")], expected)


def test_an_hf_model_with_a_short_context_gets_inputs_it_can_read(tmp_path, capsys):
    """Before: analyze and probe gave every HF model 64-token inputs, refused by a model with n_ctx 32."""
    from nope_interp.cli import main
    from nope_interp.hf import tiny_hf_model

    tiny_hf_model("smollm3-nope", seed=0, n_layers=2, n_ctx=32).save_pretrained(tmp_path / "ctx32")
    for argv in (["analyze", "--points", "z"], ["probe", "--quick", "--n-prompts", "8"]):
        code = main([*argv[:1], "--hf-path", str(tmp_path / "ctx32"), *argv[1:], "--out-root", str(tmp_path / "o")])
        assert code == 0, capsys.readouterr().err


def test_long_context_from_an_hf_folder_marks_nope_layers(tmp_path, capsys):
    from nope_interp.cli import main
    from nope_interp.hf import tiny_hf_model

    tiny_hf_model("smollm3-mixed", seed=0).save_pretrained(tmp_path / "smol")  # unwrapped: the bridge wraps in place
    code = main(["long-context", "--hf-path", str(tmp_path / "smol"), "--lengths", "16", "48", "--max-lag", "8",
                 "--n-sequences", "2", "--out-root", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads((tmp_path / "out/results/long_context/long_context.json").read_text())
    assert {r["input"] for r in data["rows"]} == {"random"}  # no task text for a foreign vocabulary
    assert all(r["layer_types"] == ["rope", "rope", "rope", "nope"] for r in data["rows"])
    html = (tmp_path / "out/figures/long_context/score_vs_n_random.html").read_text()
    assert "L3 z (NoPE)" in html and "L0 z (RoPE)" in html


def test_analyze_and_probe_from_an_hf_folder(tmp_path, capsys):
    """analyze and probe take --hf-path: random tokens of the model's vocabulary, layer types measured; the
    scores equal analyze_tokens on the same tokens (seeded), and the probe's noise control has that length."""
    import torch

    from nope_interp.analysis import analyze_tokens
    from nope_interp.cli import main
    from nope_interp.hf import load_hf, tiny_hf_model
    from nope_interp.jobs.common import HF_RANDOM_LENGTH

    tiny_hf_model("smollm3-mixed", seed=0).save_pretrained(tmp_path / "smol")
    out = tmp_path / "out"
    assert main(["analyze", "--hf-path", str(tmp_path / "smol"), "--n-prompts", "3", "--points", "z",
                 "--out-root", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "blocks.3.attn.hook_z (nope)" in printed and "blocks.0.attn.hook_z (rope)" in printed
    scores = json.loads((out / "results/analyze/hf-smol/scores.json").read_text())
    assert scores["layer_types"] == ["rope", "rope", "rope", "nope"] and scores["protocol"] == "random"
    bridge = load_hf(tmp_path / "smol")
    ids = torch.arange(1, bridge.cfg.d_vocab)  # id 0 is the padding id: zero embedding, never drawn
    tokens = ids[torch.randint(0, len(ids), (3, HF_RANDOM_LENGTH), generator=torch.Generator().manual_seed(1))]
    ref = analyze_tokens(bridge, tokens, ("z",)).scores["row_mean"]
    for site, value in ref.items():
        assert scores["scores"]["row_mean"][site]["mean"] == pytest.approx(value["mean"], abs=1e-6)
    assert main(["probe", "--hf-path", str(tmp_path / "smol"), "--n-prompts", "8", "--quick", "--features",
                 "norm", "--out-root", str(out)]) == 0
    probe = json.loads((out / "results/probe/probe.json").read_text())
    assert {r["task"] for r in probe["rows"]} == {"random"}
    assert {r["site"] for r in probe["rows"]} == {"hook_embed", "blocks.0.attn.hook_z", "blocks.0.hook_resid_post",
                                                  "blocks.3.attn.hook_z", "blocks.3.hook_resid_post"}
    assert main(["analyze", "--hf-path", str(tmp_path / "smol"), "--protocol", "authors",
                 "--out-root", str(out)]) == 2
    assert "applies to task models" in capsys.readouterr().err


def test_random_tokens_never_draw_an_id_with_a_zero_embedding(tiny_models):
    """A Hugging Face padding id has a zero embedding (no cosine): random inputs skip it, for several seeds
    and lengths (at 4 x 64 draws from 128 ids, a draw over every id would hit it almost surely)."""
    from nope_interp.jobs.common import random_tokens

    for name in ("smollm3-mixed", "llama"):
        bridge = tiny_models[name][1]
        zero = torch.nonzero(bridge.W_E.norm(dim=-1) == 0).flatten().tolist()
        assert zero, name  # the fault exists in these models, so the test can fail
        for seed in range(4):
            for length in (16, 64):
                toks = random_tokens(bridge, 4, length, seed)
                assert toks.shape == (4, length) and not set(toks.flatten().tolist()) & set(zero)
        assert len(set(random_tokens(bridge, 8, 64, 0).flatten().tolist())) > 100  # still spread over the rest


def test_hf_path_errors_are_one_line(tmp_path, capsys):
    from nope_interp.cli import main

    assert main(["long-context", "--hf-path", str(tmp_path), "--lengths", "16", "--max-lag", "4"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["analyze", "--hf-path", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["ablate", "--hf-path", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --hf-path" in err  # not among ablate's flags
    # ... and says which commands take it, and why this one does not (before: the bare argparse message)
    assert "--hf-path is taken by analyze, probe, long-context (a Hugging Face model has no task to score" in err
    assert main(["train-text", "--hf-path", str(tmp_path)]) == 2  # trains on text: the reason does not hold
    err = capsys.readouterr().err
    assert "--hf-path is taken by analyze" in err and "no task to score" not in err
    assert main(["probe", "--with-seed"]) == 2  # no abbreviations (before: taken for --with-seeds, every model)
    assert "unrecognized arguments: --with-seed" in capsys.readouterr().err
    assert main(["long-context", "--hf-path", str(tmp_path), "--pretrained", "reversal"]) == 2


def test_only_the_hf_module_imports_transformers():
    root = Path(__file__).resolve().parents[1] / "nope_interp"
    importers = [p.relative_to(root).as_posix() for p in root.rglob("*.py")
                 if re.search(r"^\s*(from|import) transformers\b", p.read_text(), re.MULTILINE)]
    assert importers == ["hf.py"]


def test_tiny_hf_model_leaves_the_global_rng_alone_and_checks_its_sizes():
    """Before: it called torch.manual_seed(seed), resetting the caller's random stream."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.hf import tiny_hf_model

    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_hf_model("llama", seed=0, n_layers=1, d_model=16, vocab=32, n_ctx=16)
    assert torch.equal(torch.rand(3), want)
    b = tiny_hf_model("llama", seed=0, n_layers=1, d_model=16, vocab=32, n_ctx=16)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))   # same seed
    for kwargs, words in (({"d_model": 30}, "multiple of 8"), ({"n_layers": 0}, "n_layers must be an integer"),
                          ({"seed": -1}, "seed must be"), ({"vocab": 2}, "vocab must be")):
        with pytest.raises(NopeInterpError, match=words):
            tiny_hf_model("llama", **kwargs)


def test_layer_types_of_16_bit_models_are_not_confused_by_rounding():
    """The evenness test refused bf16 NoPE models: rounding alone spreads text-nope's weights by 0.12 at 64 tokens."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from nope_interp.positional import layer_positional_types
    from nope_interp.text_train import load_text_run

    for name, types in (("text-nope", ("nope",) * 3), ("text-hybrid", ("rope", "rope", "nope"))):
        model = load_text_run(f"nope_interp/pretrained/text/{name}")[0].to(torch.bfloat16)
        for tokens in (None, (torch.arange(64) % 90)[None]):
            assert layer_positional_types(model, tokens) == types, name
    alibi = HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4,
                                                      d_vocab=20, act_fn="relu", positional_embedding_type="alibi"))
    assert layer_positional_types(alibi.to(torch.bfloat16)) == ("alibi", "alibi")


def test_hf_helpers_refuse_what_is_not_a_hf_model_or_path_in_one_line(tmp_path):
    """Before: expected_layer_types(torch.nn.Linear(2, 2)) raised AttributeError ('Linear' object has no attribute
    'config'), and load_hf(3) from Python spoke of "--hf-path", a flag the Python caller never gave."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.hf import expected_layer_types, load_hf

    with pytest.raises(NopeInterpError, match="^expected_layer_types needs a Hugging Face model .*got Linear$"):
        expected_layer_types(torch.nn.Linear(2, 2))
    model = torch.nn.Linear(2, 2)
    model.config = object()   # a config without num_hidden_layers
    with pytest.raises(NopeInterpError, match="^expected_layer_types: the config of Linear has no integer "
                                              "num_hidden_layers"):
        expected_layer_types(model)
    with pytest.raises(NopeInterpError, match=r"^path must be a non-empty path .*got int 3"):
        unhooked(load_hf)(3)
    with pytest.raises(NopeInterpError, match=r"^path .* is not a folder saved by save_pretrained"):
        load_hf(tmp_path)
    with pytest.raises(NopeInterpError, match="^model_dir must be a non-empty path"):
        unhooked(load_hf)("", what="model_dir")


# Bridges the toolkit did not know how to read (a hostile review, 2026-12-05). Before: a Mistral bridge's sliding
# window was invisible (layer-0 entropy 0.697 where the pattern is uniform over its window, 0.9998; the uniform
# intervention let in keys outside the window); a GPT-2 bridge raised AttributeError 'W_pos' from is_nope.


def _mistral(window, n_layers=2, **extra):
    from transformers import MistralConfig, MistralForCausalLM

    from nope_interp.hf import bridge_from_hf

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = MistralForCausalLM(MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                                              sliding_window=window, attn_implementation="eager", **extra)).eval()
    return bridge_from_hf(hf)


def _naive_relative_entropy(pattern):
    """Per (batch, head, query >= 1): entropy of the row over its non-zero keys / log(number of keys the row
    may see), the keys it may see read off the pattern itself (a loop, no toolkit code)."""
    out = []
    for b in range(pattern.shape[0]):
        for h in range(pattern.shape[1]):
            for q in range(1, pattern.shape[2]):
                row = pattern[b, h, q, : q + 1].double()
                allowed = int((row > 0).sum())
                p = row[row > 0]
                out.append(float(-(p * p.log()).sum()) / max(torch.tensor(allowed).double().log().item(), 1e-300))
    return sum(out) / len(out)


@pytest.mark.parametrize("window", [2, 4, 7])
def test_a_sliding_window_bridge_is_read_with_its_window(window):
    from nope_interp import diagnostics
    from nope_interp.averaging import attention_window
    from nope_interp.interventions import pattern_kind_unsupported
    from nope_interp.lens import averaging_check

    bridge = _mistral(window)
    assert [attention_window(bridge.cfg, layer) for layer in range(2)] == [window, window]
    tokens = torch.randint(3, 128, (3, 16), generator=torch.Generator().manual_seed(window))
    _, cache = bridge.run_with_cache(tokens)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert int((pattern[0, 0, -1] > 0).sum()) == window  # HF's window counts the query itself, as ours
    want = _naive_relative_entropy(pattern)
    assert diagnostics.layer0_attention_entropy(bridge, tokens) == pytest.approx(want, abs=1e-5)
    assert averaging_check(cache, 0).relative_entropy == pytest.approx(want, abs=1e-5)
    assert "sliding-window" in diagnostics.layer0_interventions_unsupported(bridge)
    assert "sliding-window" in pattern_kind_unsupported(bridge, 0, "uniform")


def test_hugging_face_sliding_window_fields_per_layer():
    from types import SimpleNamespace

    from nope_interp.averaging import attention_window
    from nope_interp.errors import NopeInterpError

    mixed = SimpleNamespace(sliding_window=8, layer_types=["full_attention", "sliding_attention"])
    assert [attention_window(mixed, layer) for layer in (0, 1)] == [None, 8]
    assert attention_window(SimpleNamespace(sliding_window=8, use_sliding_window=False), 0) is None
    assert attention_window(SimpleNamespace(sliding_window=None), 0) is None
    assert attention_window(SimpleNamespace(sliding_window=5), 3) == 5  # Mistral: every layer
    with pytest.raises(NopeInterpError, match=r"layer must be an integer in \[0, 2\) for this model's layer_types"):
        attention_window(mixed, 2)


def test_a_learned_position_bridge_is_typed_not_an_attribute_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError
    from nope_interp.hf import bridge_from_hf

    bridge = bridge_from_hf(GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4)).eval())
    assert diagnostics.is_nope(bridge) is False
    assert "learned positional embeddings" in diagnostics.position_in_values(bridge)
    with pytest.raises(NopeInterpError, match="learned positional embeddings"):
        diagnostics.layer0_interventions(bridge, torch.randint(3, 128, (2, 8)))


def test_nope_and_rope_bridges_are_typed(tiny_models):
    from nope_interp import diagnostics

    assert diagnostics.is_nope(tiny_models["smollm3-nope"][1]) is True
    assert diagnostics.is_nope(tiny_models["llama"][1]) is False
    for kind in ("smollm3-nope", "llama", "smollm3-mixed"):  # RoPE rotates queries and keys, not values
        assert diagnostics.position_in_values(tiny_models[kind][1]) is None


def test_layer0_window_matters_only_when_the_inputs_are_wider(tiny_models):
    """Before: any sliding window in any layer refused the layer-0 interventions, even a default Mistral
    window of 4,096 keys on 10-token inputs, or a window in later layers only."""
    from nope_interp import diagnostics

    assert "of 4 keys in layer 0" in diagnostics.layer0_interventions_unsupported(_mistral(4), 10)
    assert "of 4 keys in layer 0" in diagnostics.layer0_interventions_unsupported(_mistral(4))  # any length
    wide = diagnostics.layer0_interventions_unsupported(_mistral(4096), 10)
    assert "sliding-window" not in wide and "TransformerBridge" in wide  # the next reason: a bridge's weights


def test_value_geometry_and_the_causal_test_refuse_a_bridge_in_one_line(tiny_models):
    """Before: value_geometry(bridge of a bias-free Llama, task) raised TypeError (Tensor + None)."""
    from conftest import unhooked

    import tasks
    from nope_interp import diagnostics
    from nope_interp.errors import NopeInterpError

    bridge = tiny_models["llama"][1]
    with pytest.raises(NopeInterpError, match="^value_geometry reads a HookedTransformer's own layer-0 weights; got "
                                              "a TransformerBridge"):
        unhooked(diagnostics.value_geometry)(bridge, tasks.get_task("addition"))
    with pytest.raises(NopeInterpError, match="does not apply to this model: a TransformerBridge"):
        diagnostics.layer0_interventions(bridge, torch.randint(3, 128, (2, 8)))


def test_long_context_records_a_bridges_layer0_window():
    """Before: a Hugging Face model's rows said window None whatever its sliding window."""
    import tasks
    from nope_interp.jobs import long_context
    from nope_interp.jobs.common import ModelEntry

    entries = [ModelEntry(label=f"hf-w{w}", kind="hf", model=_mistral(w, n_layers=1), model_cfg=None,
                          task=tasks.get_task("reversal")) for w in (4, None)]
    result = long_context.run(long_context.LongContextConfig(lengths=(16,), n_sequences=2, max_lag=4,
                                                             inputs=("random",)), entries)
    assert [r.arch["window"] for r in result.rows] == [4, None]
