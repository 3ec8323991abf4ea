"""Where does layer-0 attention go when dropout 0.2 moves it off uniform? Reversal, packed, 64- vs 256-character
windows, at the same steps.

Causal attention over keys 0..i is uniform when every key gets 1/(i+1) of query i's attention; then the
head's output at i is the running mean of the values, which is what gives nearby positions similar vectors.
This script reads layer-0 attention patterns (`blocks.0.attn.hook_pattern`) of reversal models trained with
the packed objective and the authors' dropout 0.2 at the kept steps, and says for each where the mass went,
as a ratio to what uniform attention would give the same keys (1.0 = as uniform; mean over heads, queries
and inputs; queries at positions >= 1):

- `self`: the query's own key; `previous`: the key just before it; `recent`: keys 2-7 back;
- `first`: key 0 (the input's first character);
- per key character class: `newline`, the prompt's letters and `(`, its digits, `)` and `=`;

plus the normalised entropy (1 = uniform, the trajectory's `L0 attention entropy`) and the L0 `hook_z`
row-mean adjacency score on the same inputs. Then per head: its entropy, the score of its `hook_z` alone, and
the share of each query's attention on the first character of the line the query is in (`r` of `rev(`; in a
`full` prompt key 0), which a head that locates the line's start would concentrate on; and the causal
test: the L0 `hook_z` score (all heads, full prompts) with the attention of the head with the largest
line-start share made uniform, and with every other head's made uniform instead. Inputs: the 64 `full`
prompts the trajectory scores
(`rev(16 digits)=`, 21 characters) and 64 `window` inputs (64 characters of newline-joined test lines, the
training distribution of the 64-character runs; the 256-character runs trained on longer windows of the same
text). Runs read from `runs/` (not in the repository: their `config.json` commands retrain them).

Run: .venv/bin/python docs/measured/scripts/l0_attention_targets.py [--out FILE.md] (about 1 minute)
"""
import argparse
import sys
from pathlib import Path

import torch

from nope_interp import io
from nope_interp.diagnostics import layer0_head_entropies
from nope_interp.model import build_model, load_state
from nope_interp.pretrained import CANDIDATES_DIR, load_run
from nope_interp.similarity import adjacency_score_of_activations
from tasks.base import window_inputs
from tasks.vocab import encode_tensor

RUNS = [
    ("reversal-packed-drop02-s0", "3x128, 64-character windows"),
    ("candidates/reversal-packed-drop02-s0", "3x128, 64-character windows, at its end (16,000; test 0.944)"),
    ("reversal-packed-drop02-s1", "3x128, 64-character windows, seed 1"),
    ("candidates/reversal-packed-s0", "3x128, 64-character windows, dropout 0.1, at 99%"),
    ("reversal-packed-w256-drop02-s0", "3x128, 256-character windows"),
    ("reversal-packed-6x128-drop02-s0", "6x128, 64-character windows"),
    ("reversal-packed-6x128-w256-drop02-s0", "6x128, 256-character windows"),
]
STEPS = (0, 400, 1600, 3200, 6400, 12800)
CLASSES = ("newline", "letters and (", "digits", ")", "=")


def char_class(c: str) -> int:
    """Index into CLASSES of one character of a reversal input."""
    if c == "\n":
        return 0
    if c.isdigit():
        return 2
    if c == ")":
        return 3
    if c == "=":
        return 4
    return 1


def attention_targets(pattern: torch.Tensor, texts: list[str]) -> dict[str, float]:
    """Mass ratios to uniform (see the module docstring) of ``pattern`` [batch, head, query, key] over ``texts``.

    For each statistic, the attention mass on the chosen keys summed over heads, queries >= 1 and inputs,
    divided by the mass uniform causal attention puts on the same keys (each key 1/(i+1) for query i).
    """
    b, h, n, _ = pattern.shape
    q = torch.arange(n)
    causal = (q[None, :] <= q[:, None]).float()  # [query, key]
    uniform = causal / causal.sum(-1, keepdim=True)
    lag = q[:, None] - q[None, :]
    masks = {
        "self": lag == 0,
        "previous": lag == 1,
        "recent": (lag >= 2) & (lag <= 7),
        "first": (q[None, :] == 0).expand(n, n),
    }
    cls = torch.tensor([[char_class(c) for c in t] for t in texts])  # [batch, key]
    keep = q >= 1
    out = {}
    p = pattern[:, :, keep].sum(1)  # [batch, query, key], summed over heads
    u = uniform[keep] * h
    for name, m in masks.items():
        m = m[keep].float()
        out[name] = float((p * m).sum() / (u * m).sum().mul(b))
    for k, name in enumerate(CLASSES):
        m = (cls == k).float()[:, None, :]  # [batch, 1, key]
        denom = (u[None] * m).sum()
        out[name] = float((p * m).sum() / denom) if denom > 0 else float("nan")
    ent = -(pattern * pattern.clamp_min(1e-12).log()).sum(-1)[:, :, keep]  # [batch, head, query]
    out["entropy"] = float((ent / (q[keep] + 1).float().log()).mean())
    return out


def line_start_share(pattern: torch.Tensor, texts: list[str]) -> tuple[list[float], float]:
    """Per head, the mean share of a query's attention on the first character (`r` of `rev(`) of the line it is
    in, over queries >= 1 that have one; and what uniform attention would give (1/(i+1) averaged the same way).
    ``pattern`` is [batch, head, query, key]."""
    b_idx, q_idx, k_idx = [], [], []
    for b, text in enumerate(texts):
        last = None
        for i, c in enumerate(text):
            if c == "r":
                last = i
            if last is not None and i >= 1:
                b_idx.append(b)
                q_idx.append(i)
                k_idx.append(last)
    bi, qi, ki = (torch.tensor(x) for x in (b_idx, q_idx, k_idx))
    share = pattern[bi, :, qi, ki]  # [n, head]
    return share.mean(0).tolist(), float((1.0 / (qi + 1).float()).mean())


def z_score_with_uniform_heads(model, tokens: torch.Tensor, heads: list[int]) -> float:
    """Row-mean score of L0 `hook_z` (all heads) with the attention of ``heads`` replaced by uniform causal
    attention (a forward hook on `blocks.0.attn.hook_pattern`)."""
    n = tokens.shape[1]
    uniform = torch.tril(torch.ones(n, n))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    store = {}

    def flatten(pattern, hook):
        pattern = pattern.clone()
        pattern[:, heads] = uniform.to(pattern.dtype)
        return pattern

    def save(z, hook):
        store["z"] = z

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", flatten),
                                                ("blocks.0.attn.hook_z", save)])
    return float(adjacency_score_of_activations(store["z"].flatten(2)).nanmean())


def measure(run_name: str, step: int, kinds: dict[str, list[str]]) -> dict[str, dict[str, float]] | None:
    """The statistics of one run's kept weights at ``step`` on each kind of input; None if not kept."""
    if run_name.startswith("candidates/"):  # the final weights of a run kept in the repository
        if step != STEPS[0]:
            return None
        run_dir = CANDIDATES_DIR / run_name.removeprefix("candidates/")
        path = run_dir / "model.safetensors"
    else:
        run_dir = Path("runs") / run_name
        path = run_dir / "checkpoints" / f"step_{step:06d}.safetensors"
    if not path.exists():
        return None
    run = load_run(run_dir)
    model = build_model(run.model_cfg)
    load_state(model, io.load_weights(path), str(path))
    model.eval()
    res = {}
    for kind, texts in kinds.items():
        tokens = (run.task.prompt_tokens(texts) if kind == "full"
                  else torch.stack([encode_tensor(t) for t in texts]))
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in (
                "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"))
        pattern = cache["blocks.0.attn.hook_pattern"]
        stats = attention_targets(pattern, texts)
        z = cache["blocks.0.attn.hook_z"]  # [batch, pos, head, d_head]
        stats["l0_z_score"] = float(adjacency_score_of_activations(z.flatten(2)).nanmean())
        stats["heads"] = layer0_head_entropies(model, tokens).tolist()
        stats["head_z"] = [float(adjacency_score_of_activations(z[:, :, h]).nanmean()) for h in range(z.shape[2])]
        stats["line_start"], stats["line_start_uniform"] = line_start_share(pattern, texts)
        res[kind] = stats
    top = max(range(len(res["window"]["line_start"])), key=lambda h: res["window"]["line_start"][h])
    full_tokens = run.task.prompt_tokens(kinds["full"])
    others = [h for h in range(len(res["full"]["heads"])) if h != top]
    res["full"]["top_head"] = top
    res["full"]["z_top_uniform"] = z_score_with_uniform_heads(model, full_tokens, [top])
    res["full"]["z_others_uniform"] = z_score_with_uniform_heads(model, full_tokens, others)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = load_run(Path("runs") / RUNS[0][0])
    kinds = {
        "full": base.task.analysis_prompts(args.n, 0, base.train_prompts),
        "window": window_inputs(base.task, args.n, 64, seed=0, exclude=base.train_prompts),
    }
    lines = ["| run | step | inputs | entropy | self | previous | recent (2-7 back) | first | "
             + " | ".join(CLASSES) + " | L0 `hook_z` |", "|" + "---|" * (9 + len(CLASSES))]
    per_head = []
    for run_name, label in RUNS:
        for step in STEPS:
            res = measure(run_name, step, kinds)
            if res is None:
                continue
            per_head.append(((label, "end" if run_name.startswith("candidates/") else f"{step:,}"), res))
            for kind, s in res.items():
                shown = "end" if run_name.startswith("candidates/") else f"{step:,}"
                row = [label, shown, kind, f"{s['entropy']:.3f}"] + [
                    f"{s[k]:.2f}" for k in ("self", "previous", "recent", "first", *CLASSES)] + [
                    f"{s['l0_z_score']:.3f}"]
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    heads = ["", "Per head: normalised entropy and L0 `hook_z` score of the head alone on the full prompts; the share"
             " of a query's attention on the first character of its own line (`r` of `rev(`) on the windows"
             " (uniform attention: the last column).", "",
             "| run | step | entropy per head (full) | `hook_z` per head (full) | line-start share per head (window) "
             "| uniform | L0 `hook_z` as is / with the top line-start head's attention uniform / with the other heads' "
             "(full) |", "|---|---|---|---|---|---|---|"]
    for (label, step), res in per_head:
        f, w = res["full"], res["window"]
        heads.append(f"| {label} | {step} | " + " / ".join(f"{v:.2f}" for v in f["heads"]) + " | "
                     + " / ".join(f"{v:.3f}" for v in f["head_z"]) + " | "
                     + " / ".join(f"{v:.3f}" for v in w["line_start"])
                     + f" | {w['line_start_uniform']:.3f} | {f['l0_z_score']:.3f} / {f['z_top_uniform']:.3f} (head "
                     f"{f['top_head']}) / {f['z_others_uniform']:.3f} |")
        print(heads[-1], flush=True)
    text = "\n".join(lines + heads) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
