"""The adjacency analysis of one model (nope_interp.analysis): the pattern at init, and the input protocols."""

import pytest


def test_analyze_model_reproduces_the_pattern_at_init():
    """The paper's claims 1-2 on an initialised NoPE model of moderate width: ~0.5 at the embeddings,
    high after the first causal attention layer; and no pattern with bidirectional attention."""
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.model import build_model, preset

    task = tasks.get_task("reversal")
    res = analyze_model(build_model(preset("cpu", d_model=256, d_head=64, seed=2)), task, n_prompts=48)
    sc = res.scores["row_mean"]
    assert 0.4 < sc["hook_embed"]["mean"] < 0.6
    assert sc["blocks.0.attn.hook_z"]["mean"] > 0.9
    assert set(res.scores) == {"row_mean", "pooled", "pooled_rounded"}
    assert res.per_sequence["pooled"].shape == (len(res.sites), 48)
    # the lag profile after the first attention layer follows uniform causal averaging (near-uniform attention
    # at init); the embeddings are not averaged: no recency gap there
    from nope_interp.similarity import uniform_causal_lag_profile

    ideal = uniform_causal_lag_profile(task.max_prompt_len)
    z = res.lag_profile["blocks.0.attn.hook_z"]
    assert max(abs(m - u) for m, u in zip(z["mean"], ideal.tolist(), strict=True)) < 0.1
    assert z["recency_gap"]["mean"] > 0.5 and abs(res.lag_profile["hook_embed"]["recency_gap"]["mean"]) < 0.2
    bi_model = build_model(preset("cpu", d_model=256, d_head=64, attention="bidirectional"))
    bi = analyze_model(bi_model, task, n_prompts=48)
    assert 0.35 < bi.scores["row_mean"]["blocks.0.attn.hook_z"]["mean"] < 0.65


@pytest.mark.parametrize("protocol", ["full", "authors", "window"])
def test_protocol_is_recorded_and_inputs_have_the_protocol_length(tiny_model, protocol):
    import tasks
    from nope_interp.analysis import analyze_model

    task = tasks.get_task("reversal")
    res = analyze_model(tiny_model, task, 6, seed=2, points=("embed",), protocol=protocol,
                        **({"window": 30} if protocol == "window" else {}))
    length = {"full": 22, "authors": 22, "window": 30}[protocol]
    assert res.protocol == protocol and res.to_dict()["protocol"] == protocol
    assert len(res.example_prompt) == length and res.example_sim.shape[-1] == length


def test_unknown_protocol_and_inputs_longer_than_n_ctx(tiny_model):
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.errors import NopeInterpError

    task = tasks.get_task("reversal")
    with pytest.raises(NopeInterpError, match="unknown protocol 'padded'"):
        analyze_model(tiny_model, task, 4, protocol="padded")
    with pytest.raises(NopeInterpError, match="window inputs of 100 tokens"):
        analyze_model(tiny_model, task, 4, protocol="window", window=100)


def test_typed_score_accessor_equals_the_json_scores(tiny_model):
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.errors import NopeInterpError

    res = analyze_model(tiny_model, tasks.get_task("addition"), 5, points=("embed", "z"))
    s = res.score("blocks.0.attn.hook_z", "pooled")
    assert (s.mean, s.std, s.n) == tuple(res.scores["pooled"]["blocks.0.attn.hook_z"][k] for k in ("mean", "std", "n"))
    with pytest.raises(NopeInterpError, match="was not analysed"):
        res.score("blocks.0.hook_resid_post")
    with pytest.raises(NopeInterpError, match="unknown reduction"):
        res.score("hook_embed", "median")
    assert res.score("hook_embed", "pooled_rounded").mean == pytest.approx(
        float(res.per_sequence["pooled"][0].double().mul(100).round().div(100).mean()), abs=1e-12)
    assert res.to_dict()["mean_matrix_scores"]["pooled"]["hook_embed"] == res.mean_matrix_score("hook_embed")
    for args, match in [(("blocks.0.hook_resid_post",), "was not analysed"),
                        (("hook_embed", "pooled_rounded"), "unknown reduction 'pooled_rounded' for the prompt")]:
        with pytest.raises(NopeInterpError, match=match):
            res.mean_matrix_score(*args)


def test_a_result_shows_its_score_table_not_its_tensors(tiny_model):
    """Printed or shown in Jupyter, a result is its score table (before: the dataclass repr of every tensor,
    some 100,000 characters for 4 sequences of 256 tokens)."""
    import torch

    import tasks
    from nope_interp.analysis import analyze_model, analyze_tokens
    from nope_interp.stats import fmt_mean_std

    res = analyze_model(tiny_model, tasks.get_task("addition"), 6, points=("embed", "z"))
    text, page = repr(res), res._repr_html_()
    assert "tensor" not in text and "tensor" not in page and len(text) < 200 * (len(res.sites) + 2)
    assert "6 sequences (addition, full inputs" in text.splitlines()[0]
    for site in res.sites:
        (line,) = [ln for ln in text.splitlines() if ln.split() and ln.split()[0] == site]
        for reduction in ("row_mean", "pooled"):
            st = res.scores[reduction][site]
            assert fmt_mean_std(st["mean"], st["std"], st["n"]) in line
            assert f"<td>{fmt_mean_std(st['mean'], st['std'], st['n'])}</td>" in page
        gap = res.lag_profile[site]["recency_gap"]
        assert line.endswith(fmt_mean_std(gap["mean"], gap["std"], gap["n"]))
    tokens = analyze_tokens(tiny_model, torch.randint(0, tiny_model.cfg.d_vocab, (3, 12)), ("z",))
    assert repr(tokens).startswith("Adjacency score of 3 sequences (tokens, 12 positions)")


def test_prompts_are_run_and_scored_in_chunks_with_the_scores_of_one_pass(tiny_model, monkeypatch):
    """Memory must not grow with n_prompts: no forward pass sees more than one chunk of prompts, and the
    streamed scores equal those of all activations at once (the cosine matrices scored in one call)."""
    import torch

    import tasks
    from nope_interp import analysis
    from nope_interp.activations import collect_activations
    from nope_interp.similarity import REDUCTIONS, adjacency_score, cosine_similarity_matrix, lag_profile

    task = tasks.get_task("addition")
    sizes: list[int] = []
    forward = tiny_model.run_with_cache

    def counting(tokens, **kwargs):
        sizes.append(tokens.shape[0])
        return forward(tokens, **kwargs)

    monkeypatch.setattr(tiny_model, "run_with_cache", counting)
    n_sites = 1 + 4 * tiny_model.cfg.n_layers
    per_prompt = n_sites * task.max_prompt_len * tiny_model.cfg.d_model * 4
    for max_bytes, chunk in ((3 * per_prompt, 3), (per_prompt // 2, 1), (10**9, 11)):
        expected = min(chunk, analysis.MAX_CHUNK_PROMPTS) if chunk < 11 else analysis.MAX_CHUNK_PROMPTS
        assert analysis.analysis_chunk_size(n_sites, task.max_prompt_len, tiny_model.cfg.d_model, max_bytes) == expected
        sizes.clear()
        res = analysis.analyze_model(tiny_model, task, 11, seed=3, max_bytes=max_bytes)
        assert sizes == [chunk] * (11 // chunk) + ([11 % chunk] if 11 % chunk else [])
        acts = collect_activations(tiny_model, task.prompt_tokens(task.analysis_prompts(11, 3)))
        sim = cosine_similarity_matrix(acts.acts)
        for r in REDUCTIONS:
            torch.testing.assert_close(res.per_sequence[r], adjacency_score(sim, r), rtol=0, atol=1e-12)
        torch.testing.assert_close(res.example_sim, sim[:, 0], rtol=0, atol=1e-6)  # float32 forward, other batch
        torch.testing.assert_close(res.lag_per_sequence, lag_profile(acts.acts), rtol=0, atol=1e-6)  # float32 forward
        assert res.example_sim.untyped_storage().nbytes() == res.example_sim.numel() * 8  # not a view of all
        # the prompt-averaged matrix, summed over chunks, scores as the mean of all the sequences' matrices
        for r in ("row_mean", "pooled"):
            for i, site in enumerate(res.sites):
                assert res.mean_matrix_score(site, r) == pytest.approx(
                    float(adjacency_score(sim[i].mean(0), r)), abs=1e-9)
    assert analysis.analysis_chunk_size(25, 22, 384) == 2**27 // (25 * 22 * 384 * 4)
    assert analysis.analysis_chunk_size(1, 3, 8) == analysis.MAX_CHUNK_PROMPTS


@pytest.mark.parametrize(("param", "value", "site"), [
    ("embed.W_E", float("nan"), "hook_embed"),
    ("blocks.0.attn.W_O", float("inf"), "blocks.0.hook_resid_mid"),
    ("blocks.1.mlp.W_out", float("nan"), "blocks.1.hook_resid_post"),
])
def test_non_finite_activations_are_named_with_their_site_not_as_near_zero(tiny_model, param, value, site):
    """NaN/inf weights gave "NaN entries (near-zero vectors)"; now the first non-finite site is named."""
    import torch

    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.errors import NopeInterpError
    from nope_interp.lens import adjacency_scores

    with torch.no_grad():
        tiny_model.get_parameter(param).fill_(value)
    task = tasks.get_task("reversal")
    with pytest.raises(NopeInterpError, match=rf"activations at {site} are not finite: .* NaN or inf") as err:
        analyze_model(tiny_model, task, 4)
    assert "near-zero" not in str(err.value) and "\n" not in str(err.value)
    _, cache = tiny_model.run_with_cache(task.prompt_tokens(task.analysis_prompts(4)))
    with pytest.raises(NopeInterpError, match=rf"activations at {site} are not finite"):
        adjacency_scores(cache, [site])


def test_near_zero_activations_are_named_with_their_site(tiny_model):
    import torch

    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.errors import NopeInterpError

    with torch.no_grad():
        tiny_model.embed.W_E[tasks.encode("$")[0]] = 0.0  # every addition prompt starts with "$"
    with pytest.raises(NopeInterpError, match=r"activations at hook_embed have 4 near-zero vectors .*index \(0, 0\)"):
        analyze_model(tiny_model, tasks.get_task("addition"), 4, points=("embed",))


def test_analyze_refuses_nonsense_arguments_by_name():
    """As a careless user calls them: each is one NopeInterpError naming the argument (run in a subprocess,
    so the test-time type checker does not answer first)."""
    import subprocess
    import sys

    code = r'''
import tasks
from nope_interp.analysis import analyze_model, analyze_tokens
from nope_interp.config import preset
from nope_interp.errors import NopeInterpError
from nope_interp.model import build_model

m = build_model(preset("tiny"))
task = tasks.get_task("reversal", n_digits=4)
tok = task.analysis_tokens(4, 0)
cases = [
    (lambda: analyze_tokens(m, tok, ()), "points must not be empty"),
    (lambda: analyze_tokens(m, tok, ("z",), meta=[1, 2]), "meta must be a dict"),
    (lambda: analyze_tokens(m, tok, ("z",), max_bytes=0), "max_bytes must be an integer in [1,"),
    (lambda: analyze_tokens(m, tok, ("z",), max_bytes=-5), "max_bytes must be an integer in [1,"),
    (lambda: analyze_tokens(m, tok, ("z",), task=3), "task must be a string"),
    (lambda: analyze_model(m, "reversal", 4), "task must be a tasks.Task"),
    (lambda: analyze_model(m, task, 4, seed=-1), "seed must be an integer in [0,"),
    (lambda: analyze_model(m, task, 4, seed=0.5), "seed must be an integer in [0,"),
    (lambda: analyze_model(m, task, 0), "n_prompts must be an integer in [1,"),
]
for call, message in cases:
    try:
        call()
    except NopeInterpError as err:
        assert message in str(err), (message, str(err))
    else:
        raise AssertionError(f"accepted: {message}")
assert analyze_model(m, task, 4, points=("z",)).sites  # and good input still works
print("ok", len(cases))
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok 9" in out.stdout, out.stderr[-2000:]


def test_a_sequence_whose_cosine_matrix_does_not_fit_memory_is_refused_before_the_forward(tiny_cfg, monkeypatch):
    """Before: 65,536 tokens failed in torch's allocator (34 GB) with a traceback, after the forward pass."""
    import torch

    import nope_interp.model as M
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError

    model = M.build_model(tiny_cfg)
    tokens = torch.zeros(1, 40, dtype=torch.long)
    need = 2 * 8 * 40**2
    monkeypatch.setattr(M, "_cpu_available_bytes", lambda: need - 1)
    with pytest.raises(NopeInterpError, match="the adjacency score of 40-token sequences needs about 25.0 KiB"):
        analyze_tokens(model, tokens, ("z",))
    monkeypatch.setattr(M, "_cpu_available_bytes", lambda: need + 10**9)
    from nope_interp.errors import DegenerateInputWarning

    with pytest.warns(DegenerateInputWarning, match="constant cosines"):   # one token repeated: no order to score
        assert analyze_tokens(model, tokens, ("z",)).sites


def test_bad_windows_seeds_and_sites_are_one_line_errors(tiny_model):
    """TaskError from the input builders comes out as NopeInterpError; sites must be strings."""
    import torch
    from conftest import unhooked

    import tasks
    from nope_interp.analysis import analyze_model, analyze_tokens
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs.common import entry_from_init, entry_tokens
    from nope_interp.model import preset

    task = tasks.get_task("reversal")
    for window in (0, -1):  # (types are checked in tasks.protocol_length: test_tasks)
        with pytest.raises(NopeInterpError, match="window must be an integer"):
            unhooked(analyze_model)(tiny_model, task, 4, protocol="window", window=window)
    entry = entry_from_init(preset("tiny"), task, "initialised")
    for args, match in [((0, 1), "n must be an integer"), ((4, -1), "seed must be an integer"),
                        ((4, 1, "window", 0), "window must be an integer"),
                        ((10**8, 1, "authors"), "n must be an integer")]:
        with pytest.raises(NopeInterpError, match=match):
            unhooked(entry_tokens)(entry, *args)
    res = analyze_model(tiny_model, task, 4, points=("embed", "z"))
    score, mm = unhooked(type(res).score), unhooked(type(res).mean_matrix_score)
    for call in (lambda: score(res, ["hook_embed"]), lambda: mm(res, ["hook_embed"]),
                 lambda: mm(res, "hook_embed", ["pooled"])):
        with pytest.raises(NopeInterpError, match="must be strings"):
            call()
    # one token repeated: every prompt's vectors are parallel, the averaged matrix has no order -> NaN
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = analyze_tokens(tiny_model, torch.full((2, 6), 7), points=("embed", "z"))
    assert all(v != v for r in rep.mean_matrix_scores.values() for v in r.values())
    assert res.mean_matrix_score("blocks.0.attn.hook_z") == res.mean_matrix_score("blocks.0.attn.hook_z")  # a number


@pytest.mark.parametrize("n_pos,max_lag", [(12, 3), (12, None), (7, 1), (20, 19)])
def test_the_idealised_lag_curve_of_a_result_matches_its_lags_and_sequence_length(tiny_model, n_pos, max_lag):
    """``to_dict`` took the curve of n_pos = (number of lags + 1) positions, so with ``max_lag`` below pos - 1
    it gave the curve of far shorter sequences (max_lag 3 on 12 positions: 0.797 0.642 0.5, not 0.896 ...)."""
    import dataclasses
    import math

    import torch

    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError

    tokens = torch.randint(0, 96, (2, n_pos), generator=torch.Generator().manual_seed(0))
    res = analyze_tokens(tiny_model, tokens, ("z",), max_lag=max_lag)
    d_max = max_lag or n_pos - 1
    # independent reference: c(d) = mean over queries i = d..n-1 of sqrt((i - d + 1) / (i + 1)), 0-based
    naive = [sum(math.sqrt((i - d + 1) / (i + 1)) for i in range(d, n_pos)) / (n_pos - d) for d in range(1, d_max + 1)]
    got = res.to_dict()["lag_profile"]["uniform_causal"]
    assert len(got) == d_max and res.to_dict()["n_pos"] == n_pos
    assert got == pytest.approx(naive, abs=1e-12)
    assert res.uniform_causal_lag_profile().tolist() == pytest.approx(naive, abs=1e-12)
    hand_built = dataclasses.replace(res, n_pos=0)
    assert "uniform_causal" not in hand_built.to_dict()["lag_profile"]
    with pytest.raises(NopeInterpError, match="n_pos"):
        hand_built.uniform_causal_lag_profile()
