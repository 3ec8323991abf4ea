"""The averaging-effect measurements of a model (nope_interp.averaging_checks) against direct computations."""

import json

import numpy as np
import pytest
import torch
from conftest import assert_no_hooks


@pytest.fixture
def checks():
    import nope_interp.averaging_checks as checks

    return checks


@pytest.mark.parametrize("protocol", ["full", "authors", "window"])
def test_averaging_report_against_a_direct_computation(checks, tiny_model, addition_task, protocol):
    """Head 0 of layer 1: the pattern-predicted cosines and their Spearman correlation with the observed
    ones, and the sqrt(i/k) error, recomputed with numpy/scipy loops from the same cache, on the inputs
    of each protocol (built here with tasks.protocol_inputs)."""
    from scipy.stats import spearmanr

    import tasks

    window = 20 if protocol == "window" else 64  # the others refuse a window they would ignore
    rep = checks.averaging_report(tiny_model, addition_task, 6, protocol=protocol, window=window)
    assert rep.task == "addition" and rep.n_prompts == 6 and len(rep.layers) == 2 and rep.protocol == protocol
    tokens = addition_task.prompt_tokens(tasks.protocol_inputs(addition_task, protocol, 6, 1, window=window))
    assert tokens.shape[1] == {"full": 9, "authors": 9, "window": 20}[protocol]
    assert rep.n_pos == tokens.shape[1]
    _, cache = tiny_model.run_with_cache(tokens)
    pattern = cache["blocks.1.attn.hook_pattern"].double().numpy()
    z = cache["blocks.1.attn.hook_z"].double().numpy()

    def cos(m):
        n = m / np.linalg.norm(m, axis=-1, keepdims=True)
        return n @ n.T

    low = np.tril_indices(rep.n_pos, -1)
    rho = [spearmanr(cos(pattern[b, 0])[low], cos(z[b, :, 0])[low]).statistic for b in range(6)]
    lay = rep.layers[1]
    assert lay.site == "blocks.1.attn.hook_z"
    assert lay.heads[0].spearman_pred_obs == pytest.approx(np.mean(rho), abs=1e-6)
    i = np.arange(1, rep.n_pos + 1)
    closed = np.sqrt(np.minimum.outer(i, i) / np.maximum.outer(i, i))
    mae = np.mean([np.abs(cos(z[b].reshape(rep.n_pos, -1))[low] - closed[low]) for b in range(6)])
    assert lay.closed_form_mae == pytest.approx(mae, abs=1e-5)
    assert lay.z_identity_max_abs_err < 1e-5 and len(lay.heads) == 2
    assert lay.variance_ratio[0] == pytest.approx(1.0) and len(lay.variance_ratio) == rep.n_pos
    assert len(lay.relative_entropy_by_row) == rep.n_pos - 1


def test_averaging_report_of_a_small_init_is_near_uniform(checks):
    import tasks
    from nope_interp.model import build_model, preset

    rep = checks.averaging_report(build_model(preset("cpu", d_model=256, d_head=64)), tasks.get_task("reversal"), 16)
    l0 = rep.layers[0]
    assert l0.z_identity_max_abs_err < 1e-5
    assert l0.relative_entropy > 0.95  # small init weights: nearly uniform attention
    assert l0.heads_concat.spearman_pred_obs > 0.5 and l0.closed_form_mae < 0.2
    assert len(l0.heads) == 4 and len(l0.variance_ratio) == rep.n_pos == 22
    d = rep.to_dict()
    assert list(d) == ["task", "protocol", "n_prompts", "n_pos", "layers"] and d["protocol"] == "full"
    assert d["layers"][0]["heads_concat"]["spearman_pred_obs"] == l0.heads_concat.spearman_pred_obs


def test_counterfactual_report_conditions(checks, tiny_model, addition_task):
    from nope_interp.analysis import analyze_model

    examples = addition_task.splits(50, 10, 0).test
    cf = checks.counterfactual_report(tiny_model, addition_task, layer=0, n_prompts=4, eval_examples=examples)
    assert [c.kind for c in cf.conditions] == ["clean", "uniform", "identity", "random_matched"]
    clean = analyze_model(tiny_model, addition_task, 4, 1).scores["row_mean"]
    assert dict(cf.condition("clean").scores) == {s: v["mean"] for s, v in clean.items()}
    assert all(0.0 <= c.exact_match <= 1.0 for c in cf.conditions)
    # identity attention at layer 0: hook_z of each position is its own value vector, no averaging
    assert cf.condition("identity").scores["blocks.0.attn.hook_z"] < cf.condition("uniform").scores[
        "blocks.0.attn.hook_z"]
    assert_no_hooks(tiny_model)
    no_eval = checks.counterfactual_report(tiny_model, addition_task, n_prompts=4, kinds=("uniform",))
    assert [c.exact_match for c in no_eval.conditions] == [None, None]
    assert json.loads(json.dumps(no_eval.to_dict()))["conditions"]["uniform"]["exact_match"] is None
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="no condition 'identity'"):
        no_eval.condition("identity")


def test_the_random_replacement_follows_pattern_seed_and_the_prompts_follow_seed(checks, tiny_model, addition_task):
    """``pattern_seed`` (default: ``seed``) draws the random patterns, ``seed`` the prompts; the report records
    the pattern seed. Jobs give each model its own (before, every model of a job drew the same patterns)."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    def cf(**kw):
        return checks.counterfactual_report(tiny_model, addition_task, n_prompts=4, kinds=("random_matched",), **kw)

    default = cf(seed=2)
    assert default.pattern_seed == 2 and default.to_dict()["pattern_seed"] == 2
    assert cf(seed=2, pattern_seed=2) == default
    other_draw = cf(seed=2, pattern_seed=7)
    assert other_draw.pattern_seed == 7
    assert other_draw.condition("clean") == default.condition("clean")   # the same prompts
    assert other_draw.condition("random_matched").scores != default.condition("random_matched").scores
    assert cf(seed=3, pattern_seed=7).condition("clean") != default.condition("clean")   # other prompts
    for bad in (-1, 2**63, 1.5, True, "7"):
        with pytest.raises(NopeInterpError, match="pattern_seed"):
            unhooked(checks.counterfactual_report)(tiny_model, addition_task, n_prompts=4, pattern_seed=bad)
        with pytest.raises(NopeInterpError, match="^seed must be"):   # the argument given, not pattern_seed
            unhooked(checks.counterfactual_report)(tiny_model, addition_task, n_prompts=4, seed=bad)
    # nothing random measured: no seed claimed
    assert checks.counterfactual_report(tiny_model, addition_task, n_prompts=4, kinds=("uniform",)).pattern_seed is None


@pytest.mark.parametrize("prefix", ["", "\n", "\n\n"])
def test_counterfactual_exact_match_reads_every_prompt_after_the_prefix(checks, tiny_model, addition_task, prefix,
                                                                         monkeypatch):
    """Exact match under every condition is measured after ``prefix`` (a packed model's evaluation newline),
    and equals exact_match_accuracy with that prefix on the clean model."""
    from nope_interp.evaluate import exact_match_accuracy

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("prefix"))
        return exact_match_accuracy(*args, **kwargs)

    monkeypatch.setattr(checks, "exact_match_accuracy", spy)
    examples = addition_task.splits(50, 10, 0).test
    cf = checks.counterfactual_report(tiny_model, addition_task, n_prompts=4, kinds=("uniform",),
                                      eval_examples=examples, prefix=prefix)
    assert seen == [prefix, prefix] and cf.to_dict()["eval_prefix"] == prefix
    assert cf.n_eval == len(examples) == 10 and cf.to_dict()["n_eval"] == 10
    assert cf.condition("clean").exact_match == exact_match_accuracy(tiny_model, addition_task, examples, prefix=prefix)


def test_cosine_example_matches_the_cache(checks, tiny_model, addition_task):
    from nope_interp.similarity import cosine_similarity_matrix

    ex = checks.cosine_example(tiny_model, addition_task, 1)
    assert ex.prompt == addition_task.analysis_prompts(1, seed=1)[0] and ex.layer == 1
    _, cache = tiny_model.run_with_cache(addition_task.prompt_tokens([ex.prompt]))
    torch.testing.assert_close(ex.observed, cosine_similarity_matrix(cache["blocks.1.attn.hook_z"][0].flatten(-2)))
    # the prediction: cosine of the attention rows concatenated over heads
    rows = cache["blocks.1.attn.hook_pattern"][0].double().permute(1, 0, 2).flatten(-2)
    torch.testing.assert_close(ex.predicted, cosine_similarity_matrix(rows).double().clamp(-1, 1))
    assert ex.predicted.shape == (len(ex.prompt), len(ex.prompt))


def test_a_model_that_cannot_read_the_task_is_refused_before_any_forward_pass(tiny_cfg):
    """Before: a task given by name gave AttributeError, a small n_ctx or d_vocab a TransformerLens size error,
    model.half() a dtype RuntimeError deep in attention, n_prompts=0 a TaskError naming `n`."""
    from conftest import unhooked

    import tasks
    from nope_interp import activations, analysis, averaging_checks, evaluate
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    task = tasks.get_task("reversal")
    model = build_model(tiny_cfg)
    half = build_model(tiny_cfg).half()
    short = build_model(tiny_cfg.replace(n_ctx=8))
    narrow = build_model(tiny_cfg.replace(d_vocab=30))
    tokens = torch.zeros(2, 5, dtype=torch.long)
    U = unhooked
    cases = [
        (lambda: U(averaging_checks.averaging_report)(model, "reversal"), "^averaging_report: task must be a tasks"),
        (lambda: U(averaging_checks.cosine_example)(model, "reversal"), "^cosine_example: task must be"),
        (lambda: U(averaging_checks.counterfactual_report)(model, "reversal"), "^counterfactual_report: task must"),
        (lambda: U(evaluate.predict)(model, "reversal", ["ab"]), "^predict: task must be"),
        (lambda: U(averaging_checks.averaging_report)(short, task), "n_ctx=8 is too small for 'reversal' full inputs"),
        (lambda: U(averaging_checks.cosine_example)(short, task), "n_ctx=8 is too small"),
        (lambda: U(averaging_checks.averaging_report)(narrow, task), "d_vocab=30 is smaller than the tasks' vocab"),
        (lambda: U(evaluate.predict)(narrow, task, ["ab"]), "d_vocab=30"),
        (lambda: U(averaging_checks.averaging_report)(model, task, n_prompts=0), "n_prompts must be an integer"),
    ]
    for fn_name, call in (("averaging_report", lambda: U(averaging_checks.averaging_report)(half, task)),
                          ("predict", lambda: U(evaluate.predict)(half, task, ["ab"])),
                          ("collect_activations", lambda: U(activations.collect_activations)(half, tokens)),
                          ("analyze_tokens", lambda: U(analysis.analyze_tokens)(half, tokens)),
                          ("greedy_decode", lambda: U(evaluate.greedy_decode)(half, tokens, 2))):
        cases.append((call, f"^{fn_name}: model's parameters are torch.float16 but model.cfg.dtype is torch.float32"))
    for call, words in cases:
        with pytest.raises(NopeInterpError, match=words):
            call()
    # converted the supported way, the same model runs
    assert evaluate.predict(build_model(tiny_cfg).to(torch.float64), task, ["ab"]) is not None


@pytest.mark.parametrize("fn", ["averaging_report", "counterfactual_report", "cosine_example"])
def test_bad_protocols_and_windows_are_refused_with_the_parameter_named(checks, tiny_model, addition_task, fn):
    from nope_interp.errors import NopeInterpError

    f = getattr(checks, fn)
    with pytest.raises(NopeInterpError, match="unknown protocol 'padded'; allowed: full, authors, window"):
        f(tiny_model, addition_task, protocol="padded")
    with pytest.raises(NopeInterpError, match="n_ctx=48 is too small for 'addition' window inputs of 60 tokens: "
                                              "window 48 or less fits$"):
        f(tiny_model, addition_task, protocol="window", window=60)

    for protocol in ("full", "authors"):  # a window these protocols would ignore
        with pytest.raises(NopeInterpError, match=f"window=20 is only used with protocol 'window'; with protocol "
                                                  f"'{protocol}' it would be ignored"):
            f(tiny_model, addition_task, protocol=protocol, window=20)
    for window in (1, 2):  # no adjacency score (a 1x1 or 2x2 cosine matrix)
        with pytest.raises(NopeInterpError, match=f"window must be an integer >= 3 .*, got {window}"):
            f(tiny_model, addition_task, protocol="window", window=window)
    assert f(tiny_model, addition_task, protocol="window", window=3).protocol == "window"


@pytest.mark.parametrize("fn", ["averaging_report", "counterfactual_report", "cosine_example"])
def test_n_ctx_is_checked_against_the_protocols_inputs(checks, fn):
    """A model with a short context reads window inputs that fit it; full-length prompts that do not are
    refused with their protocol and length named."""
    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model, preset

    small, task = build_model(preset("tiny", n_ctx=16)), tasks.get_task("reversal")
    f = getattr(checks, fn)
    out = f(small, task, protocol="window", window=8)
    assert out.protocol == "window"
    if fn == "averaging_report":
        assert out.n_pos == 8
    elif fn == "cosine_example":
        assert len(out.prompt) == 8 and out.observed.shape == (8, 8)
    with pytest.raises(NopeInterpError, match="n_ctx=16 is too small for 'reversal' full inputs of 22 tokens"):
        f(small, task)


def test_an_empty_list_of_evaluation_examples_is_refused_not_ignored(checks, tiny_model, addition_task):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="non-empty sequence"):
        checks.counterfactual_report(tiny_model, addition_task, n_prompts=3, eval_examples=[])


@pytest.mark.parametrize("kinds", [("global", "local"), ("local", "global")])
def test_models_that_mix_global_and_local_layers_get_each_layer_s_own_keys(kinds):
    """With GPT-Neo-style attn_types every layer was checked against the sliding window: a global layer 0
    was refused ("puts weight on a key outside its sliding window") by averaging_check, averaging_report and
    layer0_attention_entropy. The window now applies to the local layers only."""
    import math

    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    import tasks
    from nope_interp.averaging import attention_window
    from nope_interp.averaging_checks import averaging_report
    from nope_interp.diagnostics import layer0_attention_entropy
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import averaging_check

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(
        n_layers=2, d_model=32, n_ctx=32, d_head=8, n_heads=4, d_vocab=96, act_fn="relu",
        positional_embedding_type="rotary", use_local_attn=True, attn_types=list(kinds), window_size=4)).eval()
    cfg = model.cfg
    assert [attention_window(cfg, i) for i in range(2)] == [4 if k == "local" else None for k in kinds]
    with pytest.raises(NopeInterpError, match=r"layer must be an integer in \[0, 2\)"):
        attention_window(cfg, 2)
    tokens = torch.randint(0, 96, (3, 12), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        assert -1.0 <= averaging_check(cache, layer).spearman_pred_obs <= 1.0
    rep = averaging_report(model, tasks.get_task("reversal", n_digits=4), n_prompts=4)
    assert len(rep.layers) == 2
    # layer 0's entropy against its own keys, recomputed by hand: global -> all earlier keys, local -> 4
    pattern = cache["blocks.0.attn.hook_pattern"].double()
    window = 4 if kinds[0] == "local" else None
    ents = []
    for q in range(1, 12):
        keys = range(max(0, q - window + 1) if window else 0, q + 1)
        p = pattern[:, :, q, list(keys)]
        ents.append((-(p * p.clamp_min(1e-300).log()).sum(-1) / math.log(len(keys))).mean())
    assert layer0_attention_entropy(model, tokens) == pytest.approx(float(torch.stack(ents).mean()), abs=1e-5)


def test_a_window_too_long_for_n_ctx_says_which_window_fits(tiny_cfg, addition_task):
    """Only the window protocol's length is the user's to change: its error names a window that fits; the
    authors' fixed-length inputs get no such hint."""
    from nope_interp.analysis import protocol_prompts
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model

    for n_ctx in (8, 20):
        model = build_model(tiny_cfg.replace(n_ctx=n_ctx))
        with pytest.raises(NopeInterpError, match=f"window inputs of 30 tokens: window {n_ctx} or less fits$"):
            protocol_prompts(model, addition_task, 2, 1, frozenset(), "window", 30)
        assert len(protocol_prompts(model, addition_task, 2, 1, frozenset(), "window", n_ctx)[0]) == n_ctx
    with pytest.raises(NopeInterpError, match="'addition' authors inputs of 9 tokens$"):
        protocol_prompts(build_model(tiny_cfg.replace(n_ctx=8)), addition_task, 2, 1, frozenset(), "authors", 64)


@pytest.mark.parametrize("init_std", [1e-6, 1e-7])
@pytest.mark.parametrize("fn", ["averaging_report", "cosine_example"])
def test_near_zero_hook_z_is_refused_naming_the_site_and_the_cause(checks, fn, init_std):
    """Before: averaging_report said "lower_triangle_spearman: obs must be finite, got 81 NaN ..." and
    cosine_example returned an all-NaN observed matrix."""
    import dataclasses

    import tasks
    from nope_interp.errors import NopeInterpError
    from nope_interp.model import build_model, preset

    model = build_model(dataclasses.replace(preset("tiny"), init_std=init_std))
    call = (lambda: checks.averaging_report(model, tasks.get_task("addition"), 4)) if fn == "averaging_report" \
        else (lambda: checks.cosine_example(model, tasks.get_task("addition")))
    with pytest.raises(NopeInterpError, match=r"^activations at blocks\.0\.attn\.hook_z have \d+ near-zero vectors "
                                              r"\(L2 norm < min_norm=1e-08.*their cosines are undefined"):
        call()


@pytest.mark.parametrize("kinds,words", [
    ("uniform", "kinds must be a list of pattern kinds"), (b"uniform", "kinds must be a list of pattern kinds"),
    (("uniform", "uniform"), "kinds names 'uniform' more than once"),
    (["identity", "uniform", "identity"], "kinds names 'identity' more than once"),
    (("flat",), "unknown pattern kind 'flat' in kinds"), ((3,), "unknown pattern kind 3 in kinds"),
    (None, "kinds must be a list of pattern kinds"),
])
def test_counterfactual_kinds_must_be_a_list_of_distinct_kinds(checks, tiny_model, addition_task, kinds, words):
    """Before: kinds="uniform" said "unknown pattern kind 'u'" (the string read letter by letter) and
    ("uniform", "uniform") gave two identical conditions."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match=rf"^counterfactual_report: {words}"):
        unhooked(checks.counterfactual_report)(tiny_model, addition_task, 0, kinds, n_prompts=4)
