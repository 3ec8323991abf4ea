"""Independent recomputation of headline numbers, from the definitions in docs/method.md.

The toolkit is used only to load the weights (``load_run``), to build the very prompts the analyses read
(``entry_tokens``, 256 held-out prompts, seed 1 as the CLI) and for the held-out examples (``run.splits``).
Everything else is written here from scratch: layer 0 by hand in float64 (LayerNorm, Q/K/V, causal softmax),
the adjacency score as a naive loop (row mean, ties count as failures), the attention entropy relative to
uniform causal attention, the digits' layer-0 value geometry (spread, participation ratio by covariance and
by Gram matrix), the delimiter / digit value-norm ratio, the per-position mean's share of the second moment
and greedy exact match with a full re-forward per token. Compare its output with the toolkit's numbers in
docs/measured/compare/*.json (docs/measured/independent_check/README.md has the table of 2026-12-03).

Usage (one model per call, about a minute each on one thread):
    .venv/bin/python docs/measured/scripts/independent_check.py nope_interp/pretrained/addition
    .venv/bin/python docs/measured/scripts/independent_check.py <run dir> noem   # skip exact match
"""
import json
import math
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np
import torch

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
from nope_interp.pretrained import load_run  # noqa: E402
from nope_interp.jobs.common import entry_from_run, entry_tokens  # noqa: E402

VOCAB = "\n 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
assert len(VOCAB) == 96
STOI = {c: i for i, c in enumerate(VOCAB)}


def enc(s):
    return [STOI[c] for c in s]


def layer0_manual(model, toks):
    """Layer 0 by hand in float64: returns z (b,pos,H*dh) and pattern (b,H,q,k)."""
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    cfg = model.cfg
    x = sd["embed.W_E"][toks]  # NoPE: no position added
    if "pos_embed.W_pos" in sd:
        assert sd["pos_embed.W_pos"].abs().max() == 0
    # LayerNorm (TL "LN"): centre, scale by sqrt(var + eps), w, b
    xc = x - x.mean(-1, keepdim=True)
    xn = xc / torch.sqrt((xc ** 2).mean(-1, keepdim=True) + cfg.eps)
    if "blocks.0.ln1.w" in sd:
        xn = xn * sd["blocks.0.ln1.w"] + sd["blocks.0.ln1.b"]
    q = torch.einsum("bpd,hde->bhpe", xn, sd["blocks.0.attn.W_Q"]) + sd["blocks.0.attn.b_Q"][None, :, None, :]
    k = torch.einsum("bpd,hde->bhpe", xn, sd["blocks.0.attn.W_K"]) + sd["blocks.0.attn.b_K"][None, :, None, :]
    v = torch.einsum("bpd,hde->bhpe", xn, sd["blocks.0.attn.W_V"]) + sd["blocks.0.attn.b_V"][None, :, None, :]
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
    P = toks.shape[1]
    mask = torch.triu(torch.ones(P, P, dtype=torch.bool), 1)
    scores = scores.masked_fill(mask, float("-inf"))
    pat = scores.softmax(-1)
    z = pat @ v  # b h p e
    z = z.permute(0, 2, 1, 3).reshape(toks.shape[0], P, -1)
    return z, pat


def value_vectors(model, chars):
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    x = sd["embed.W_E"][torch.tensor(enc(chars))]
    xc = x - x.mean(-1, keepdim=True)
    xn = xc / torch.sqrt((xc ** 2).mean(-1, keepdim=True) + model.cfg.eps)
    xn = xn * sd["blocks.0.ln1.w"] + sd["blocks.0.ln1.b"]
    v = torch.einsum("td,hde->the", xn, sd["blocks.0.attn.W_V"]) + sd["blocks.0.attn.b_V"]
    return v.reshape(len(chars), -1).numpy()


def adjacency_rowmean_naive(X):
    """X: (pos, d) numpy float64. Row k>=2: fraction of pairs i<j<k with C[k,i] < C[k,j]; mean over k."""
    P = X.shape[0]
    norms = [math.sqrt(sum(float(a) * float(a) for a in X[i])) for i in range(P)]
    C = np.zeros((P, P))
    for a in range(P):
        for b in range(P):
            C[a, b] = min(1.0, max(-1.0, float(np.dot(X[a], X[b])) / (norms[a] * norms[b])))
    rows = []
    for k in range(2, P):
        good = 0
        tot = 0
        for i in range(k):
            for j in range(i + 1, k):
                tot += 1
                if C[k, i] < C[k, j]:
                    good += 1
        rows.append(good / tot)
    spread = max(C[a, b] for a in range(P) for b in range(a)) - min(C[a, b] for a in range(P) for b in range(a))
    return float(np.mean(rows)), good, tot, spread


def rel_entropy(pat):
    """pat: (b,H,q,k) float64. mean over heads, prompts, rows q>=1 of H(row)/log(q+1)."""
    b, H, P, _ = pat.shape
    vals = []
    for q in range(1, P):
        p = pat[:, :, q, : q + 1]
        h = -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1)
        vals.append(h / math.log(q + 1))
    return float(torch.stack(vals, -1).mean()), torch.stack(vals, -1)


def greedy_naive(model, prompt, prefix, max_new):
    ids = enc(prefix + prompt)
    out = ""
    for _ in range(max_new):
        with torch.no_grad():
            logits = model(torch.tensor([ids]), return_type="logits")
        nxt = int(logits[0, -1].argmax())
        if VOCAB[nxt] == "\n":
            break
        out += VOCAB[nxt]
        ids.append(nxt)
    return out


def main(path, n_prompts=256, seed=1, n_em=200, do_em=True):
    run = load_run(path)
    model = run.model
    model.eval()
    task = run.task
    entry = entry_from_run(run, os.path.basename(path.rstrip("/")))
    _, _, toks = entry_tokens(entry, n_prompts, seed, "full")
    res = {"run": path, "tokens_shape": list(toks.shape), "first_prompt": "".join(VOCAB[t] for t in toks[0])}
    # TL hook_z (float32), as the analysis reads it
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n in ("blocks.0.attn.hook_z", "blocks.0.attn.hook_pattern"))
    z32 = cache["blocks.0.attn.hook_z"].reshape(toks.shape[0], toks.shape[1], -1).double().numpy()
    z64, pat64 = layer0_manual(model, toks)
    res["max_abs_z_manual_vs_TL"] = float(np.abs(z64.numpy() - z32).max())
    scores32, scores64, spreads = [], [], []
    for b in range(toks.shape[0]):
        s, _, _, sp = adjacency_rowmean_naive(z32[b])
        scores32.append(s)
        spreads.append(sp)
        scores64.append(adjacency_rowmean_naive(z64[b].numpy())[0])
    res["adj_rowmean_hookz_f32"] = float(np.mean(scores32))
    res["adj_rowmean_hookz_f32_std"] = float(np.std(scores32, ddof=1))
    res["adj_rowmean_manual_f64"] = float(np.mean(scores64))
    res["min_spread"] = float(min(spreads))
    res["n_prompt_diff_f32_f64"] = int(sum(abs(a - b) > 0 for a, b in zip(scores32, scores64)))
    # entropy
    ent64, _ = rel_entropy(pat64)
    ent32, _ = rel_entropy(cache["blocks.0.attn.hook_pattern"].double())
    res["L0_entropy_manual_f64"] = ent64
    res["L0_entropy_TLpattern"] = ent32
    # value geometry
    digits = "0123456789"
    V = value_vectors(model, digits)
    cen = V.mean(0)
    res["digit_spread"] = float(np.sqrt(((V - cen) ** 2).sum(1).mean()) / np.linalg.norm(cen))
    cov = np.cov(V, rowvar=False)  # (d,d), centred
    ev = np.linalg.eigvalsh(cov)
    ev = np.clip(ev, 0, None)
    res["digit_PR"] = float(ev.sum() ** 2 / (ev ** 2).sum())
    # PR via Gram of centred rows (same nonzero eigenvalues) as a cross-check
    Vc = V - cen
    ev2 = np.linalg.eigvalsh(Vc @ Vc.T)
    res["digit_PR_gram"] = float(ev2.sum() ** 2 / (ev2 ** 2).sum())
    # delimiters: non-digit characters of the task's prompts (from the analysed prompts and test prompts)
    chars = set()
    for ex in run.splits.test[:2000]:
        chars |= set(ex.prompt)
    for row in toks:
        chars |= {VOCAB[t] for t in row}
    delims = "".join(sorted(c for c in chars if c not in digits))
    res["delimiters"] = delims
    D = value_vectors(model, delims)
    res["delim_digit_norm_ratio"] = float(np.linalg.norm(D, axis=1).mean() / np.linalg.norm(V, axis=1).mean())
    # positional share of L0 hook_z: ||mu||^2 summed / total second moment (method.md wording)
    mu = z32.mean(0)
    res["positional_share_hookz"] = float((mu ** 2).sum() * z32.shape[0] / (z32 ** 2).sum())
    # exact match with own greedy loop
    if do_em:
        prefix = "\n" if run.train_cfg.objective == "packed" else ""
        exs = list(run.splits.test[:n_em])
        max_new = task.max_answer_len + 1
        correct = 0
        for ex in exs:
            pred = greedy_naive(model, ex.prompt, prefix, max_new)
            correct += pred == ex.answer
        res["prefix"] = repr(prefix)
        res["exact_match_200"] = correct / len(exs)
        res["n_em"] = len(exs)
        res["summary"] = run.summary
    return res


if __name__ == "__main__":
    out = main(sys.argv[1], do_em=(len(sys.argv) < 3 or sys.argv[2] != "noem"))
    print(json.dumps(out, indent=1, default=str))
    name = os.path.basename(sys.argv[1].rstrip("/"))
    with open(os.path.join(ROOT, "docs", "measured", "independent_check", f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
