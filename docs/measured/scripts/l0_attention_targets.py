"""Where does layer-0 attention go when the authors' dropout 0.2 moves it off uniform? Packed reversal and
ordering models, 64- vs 256-character windows, at the same kept steps.

Causal attention over keys 0..i is uniform when every key gets 1/(i+1) of query i's attention; then the
head's output at i is the running mean of the values, which is what gives nearby positions similar vectors.
This script reads layer-0 attention patterns (`blocks.0.attn.hook_pattern`) of models trained with the packed
objective and says where the mass went, as a ratio to what uniform attention would give the same keys (1.0 =
as uniform; mean over heads, queries and inputs; queries at positions >= 1):

- `self`: the query's own key; `previous`: the key just before it; `recent`: keys 2-7 back;
- `line word`: the letters of the query's own line, the task's word that starts every line (`rev`, `order`;
  a line starts after the latest newline, a `full` prompt is one line; queries of a window's first, cut line
  are left out);
- per key character class: newline, letters, digits, punctuation (`(`, `,`, `)`, `=`, `$`, `+`);

plus the normalised entropy (1 = uniform, the trajectory's `L0 attention entropy`) and the L0 `hook_z`
row-mean adjacency score on the same inputs. Then per head (`nope_interp.diagnostics.layer0_head_entropies`
for its entropy): the score of its `hook_z` alone, the share of each query's attention on its own line's word,
the share on every letter and newline it sees, and the causal test: the L0 `hook_z` score (all heads) with the
attention of the head of lowest entropy made uniform, with every other head's made uniform instead, and with
all heads' made uniform, on full prompts and on windows.

Inputs: the 64 `full` prompts a trajectory scores (`--n`) and 64 `window` inputs (64 characters of
newline-joined test lines: the training distribution of the 64-character runs; the 256-character runs trained
on longer windows of the same text). Runs are read from `runs/` (not in the repository: their `config.json`
commands retrain them) at their kept steps, and the final weights of runs kept in
`nope_interp/pretrained/candidates/` (`candidates/NAME`).

Run: .venv/bin/python docs/measured/scripts/l0_attention_targets.py [--out FILE.md] [--figure FILE.html]
(about 2 minutes; the figure: each head's line-word share and entropy against the step, one panel per run kept
in `runs/`; docs/measured/l0_attention/line_word_heads.png is its screenshot)
"""
import argparse
import sys
from pathlib import Path

import torch

from nope_interp import io
from nope_interp.diagnostics import layer0_attention_entropy, layer0_head_entropies
from nope_interp.model import build_model, load_state
from nope_interp.pretrained import CANDIDATES_DIR, load_run
from nope_interp.similarity import adjacency_score_of_activations
from tasks.base import window_inputs
from tasks.vocab import encode_tensor

RUNS = [
    ("reversal-packed-drop02-s0", "reversal 3x128, 64-character windows, seed 0"),
    ("candidates/reversal-packed-drop02-s0", "the same at its end (16,000 steps; test 0.944)"),
    ("reversal-packed-drop02-s1", "reversal 3x128, 64-character windows, seed 1"),
    ("candidates/reversal-packed-s0", "reversal 3x128, 64-character windows, dropout 0.1, seed 0, at 99%"),
    ("reversal-packed-w256-drop02-s0", "reversal 3x128, 256-character windows, seed 0"),
    ("reversal-packed-w256-drop02-s1", "reversal 3x128, 256-character windows, seed 1"),
    ("reversal-packed-6x128-drop02-s0", "reversal 6x128, 64-character windows, seed 0"),
    ("reversal-packed-6x128-w256-drop02-s0", "reversal 6x128, 256-character windows, seed 0"),
    ("ordering-packed-drop02-s0", "ordering 3x128, 64-character windows, seed 0"),
    ("candidates/ordering-packed-s0", "ordering 3x128, 64-character windows, dropout 0.1, seed 0, at 99%"),
]
STEPS = (0, 400, 1600, 3200, 6400, 12800)
#: kept steps past STEPS for runs with no candidate folder of their final weights (the end of their schedule)
EXTRA_STEPS = {"reversal-packed-w256-drop02-s0": (16000,)}
CLASSES = ("newline", "letters", "digits", "punctuation")
END = "end"


def char_class(c: str) -> int:
    """Index into CLASSES of one input character."""
    if c == "\n":
        return 0
    if c.isalpha():
        return 1
    if c.isdigit():
        return 2
    return 3


def line_starts(texts: list[str], full: bool) -> torch.Tensor:
    """[batch, pos]: the position of the first character of each position's line, or -1 where a window's first
    (cut) line gives none. A `full` prompt is one line that starts at 0."""
    out = torch.full((len(texts), len(texts[0])), -1, dtype=torch.long)
    for b, text in enumerate(texts):
        start = 0 if full else -1
        for i, c in enumerate(text):
            out[b, i] = start
            if c == "\n":
                start = i + 1
    return out


def attention_targets(pattern: torch.Tensor, texts: list[str], full: bool) -> dict[str, float]:
    """Mass ratios to uniform (see the module docstring) of ``pattern`` [batch, head, query, key] over ``texts``.

    For each statistic, the attention mass on the chosen keys summed over heads, queries >= 1 and inputs,
    divided by the mass uniform causal attention puts on the same keys (each key 1/(i+1) for query i).
    """
    b, h, n, _ = pattern.shape
    q = torch.arange(n)
    causal = (q[None, :] <= q[:, None]).float()  # [query, key]
    uniform = (causal / causal.sum(-1, keepdim=True))[None].expand(b, n, n)  # [batch, query, key]
    lag = (q[:, None] - q[None, :])[None].expand(b, n, n)
    starts = line_starts(texts, full)  # [batch, query]
    cls = torch.tensor([[char_class(c) for c in t] for t in texts])[:, None, :].expand(b, n, n)  # by key
    masks = {
        "self": lag == 0,
        "previous": lag == 1,
        "recent": (lag >= 2) & (lag <= 7),
        "line word": (q[None, None, :] >= starts[:, :, None]) & (starts[:, :, None] >= 0) & (cls == 1),
        **{name: cls == k for k, name in enumerate(CLASSES)},
    }
    keep = (q >= 1)[None, :, None]
    p = pattern.sum(1)  # [batch, query, key], summed over heads
    out = {}
    for name, m in masks.items():
        m = (m & keep).float()
        denom = (uniform * m).sum() * h
        out[name] = float((p * m).sum() / denom) if denom > 0 else float("nan")
    return out


def line_word_share(pattern: torch.Tensor, texts: list[str], full: bool) -> tuple[list[float], float]:
    """Per head, the mean share of a query's attention on the letters of its own line (the task's word), over
    queries >= 1 whose line starts in the input and has a letter before them; and what uniform attention would
    give (letters seen / (i+1), averaged the same way)."""
    n = len(texts[0])
    starts = line_starts(texts, full)  # [batch, query]
    q = torch.arange(n)
    letters = torch.tensor([[c.isalpha() for c in t] for t in texts])  # [batch, key]
    own = (q[None, None, :] >= starts[:, :, None]) & (q[None, None, :] <= q[None, :, None]) & letters[:, None, :]
    own &= (starts[:, :, None] >= 0)
    has = own.any(-1) & (q[None, :] >= 1)  # [batch, query]
    share = (pattern * own[:, None].to(pattern.dtype)).sum(-1)  # [batch, head, query]
    bi, qi = torch.nonzero(has, as_tuple=True)
    uniform = own.sum(-1).float() / (q[None, :] + 1).float()
    return share[bi, :, qi].mean(0).tolist(), float(uniform[bi, qi].mean())


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


def measure(run_name: str, step: int | str, n: int) -> dict[str, dict] | None:
    """The statistics of one run's weights at ``step`` (kept weights in `runs/`, or END for a candidate's
    final weights) on both kinds of input; None if not kept."""
    if run_name.startswith("candidates/"):
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
    full = run.task.analysis_prompts(n, 0, run.train_prompts)
    kinds = {"full": (full, run.task.prompt_tokens(full)),
             "window": (windows := window_inputs(run.task, n, 64, seed=0, exclude=run.train_prompts),
                        torch.stack([encode_tensor(t) for t in windows]))}
    res = {}
    for kind, (texts, tokens) in kinds.items():
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in (
                "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"))
        pattern = cache["blocks.0.attn.hook_pattern"]
        z = cache["blocks.0.attn.hook_z"]  # [batch, pos, head, d_head]
        stats = attention_targets(pattern, texts, kind == "full")
        stats["l0_z_score"] = float(adjacency_score_of_activations(z.flatten(2)).nanmean())
        stats["heads"] = layer0_head_entropies(model, tokens).tolist()
        stats["entropy"] = layer0_attention_entropy(model, tokens)
        stats["head_z"] = [float(adjacency_score_of_activations(z[:, :, h]).nanmean()) for h in range(z.shape[2])]
        stats["line_word"], stats["line_word_uniform"] = line_word_share(pattern, texts, kind == "full")
        markers = torch.tensor([[c.isalpha() or c == "\n" for c in t] for t in texts]).to(pattern.dtype)
        stats["markers"] = (pattern[:, :, 1:] * markers[:, None, None, :]).sum(-1).mean((0, 2)).tolist()
        res[kind] = stats
    f = res["full"]
    top = min(range(len(f["heads"])), key=lambda h: f["heads"][h])
    f["top_head"] = top
    n_heads = len(f["heads"])
    for kind, (_, tokens) in kinds.items():  # the causal test on both kinds of input
        res[kind]["z_top_uniform"] = z_score_with_uniform_heads(model, tokens, [top])
        others = [h for h in range(n_heads) if h != top]
        res[kind]["z_others_uniform"] = z_score_with_uniform_heads(model, tokens, others)
        res[kind]["z_all_uniform"] = z_score_with_uniform_heads(model, tokens, list(range(n_heads)))
    return res


def figure(per_run: dict[str, list[tuple[int, dict]]], path: str) -> None:
    """Each head's line-word share (windows) and entropy (full prompts) against the step, a column per run."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = [(label, rows) for label, rows in per_run.items() if len(rows) > 1]
    fig = make_subplots(rows=2, cols=len(runs), shared_yaxes=True, horizontal_spacing=0.02, vertical_spacing=0.12,
                        subplot_titles=[label.replace("reversal ", "").replace("-character windows, ",
                                                                               "-character<br>windows, ")
                                        for label, _ in runs])
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for col, (label, rows) in enumerate(runs, start=1):
        steps = [max(step, 1) for step, _ in rows]
        n_heads = len(rows[0][1]["window"]["line_word"])
        for h in range(n_heads):
            style = dict(color=colours[h % len(colours)])
            fig.add_trace(go.Scatter(x=steps, y=[r["window"]["line_word"][h] for _, r in rows], mode="lines+markers",
                                     name=f"head {h}", legendgroup=f"h{h}", showlegend=col == 1, line=style),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=steps, y=[r["full"]["heads"][h] for _, r in rows], mode="lines+markers",
                                     name=f"head {h}", legendgroup=f"h{h}", showlegend=False, line=style),
                          row=2, col=col)
        hline = dict(y=rows[0][1]["window"]["line_word_uniform"], line_dash="dot", line_color="gray", row=1, col=col)
        label = dict(annotation_text="uniform attention", annotation_position="bottom right",
                     annotation_font={"color": "gray", "size": 10})  # below the line: the heads rise above it
        fig.add_hline(**hline, **(label if col == 1 else {}))
        fig.update_xaxes(type="log", title_text="step (0 at 1)", row=2, col=col)
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="share of attention on<br>its own line's word", range=[0, 0.8], row=1, col=1)
    fig.update_yaxes(title_text="head's attention entropy<br>(1 = uniform)", range=[0, 1.05], row=2, col=1)
    fig.update_layout(title=dict(text="Layer-0 heads of packed reversal models with dropout 0.2: how much each "
                                      "attends to its own line's word",
                                 y=0.98, yanchor="top"),
                      height=680, width=250 * len(runs) + 150, font=dict(size=11), margin=dict(t=130))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True)
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--figure", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    stats_cols = ("self", "previous", "recent", "line word", *CLASSES)
    lines = ["| run | step | inputs | entropy | " + " | ".join(stats_cols) + " | L0 `hook_z` |",
             "|" + "---|" * (5 + len(stats_cols))]
    heads = ["", "Per head: normalised entropy and L0 `hook_z` score of the head alone on the full prompts (the "
             "score of a collapsed head alone is near ties: it moves by about 0.01 between float32 and float64); "
             "on the windows, the share of a query's attention on its own line's word (uniform attention gives the "
             "`uniform` column) and on every letter and newline it sees (line-start markers of any line). The "
             "causal test (all heads' L0 `hook_z`, as is / the lowest-entropy head's attention made uniform / the "
             "other heads' / all heads'), on the full prompts and on the windows.", "",
             "| run | step | entropy per head | `hook_z` per head | line-word share per head (window) | uniform "
             "| letters and newlines per head (window) | causal test, full | causal test, window |",
             "|---|---|---|---|---|---|---|---|---|"]
    per_run: dict[str, list[tuple[int, dict]]] = {}
    for run_name, label in RUNS:
        for step in ((END,) if run_name.startswith("candidates/") else STEPS + EXTRA_STEPS.get(run_name, ())):
            res = measure(run_name, step, args.n)
            if res is None:
                continue
            if step != END and run_name.startswith("reversal"):
                per_run.setdefault(label, []).append((step, res))
            shown = step if step == END else f"{step:,}"
            for kind, s in res.items():
                row = [label, shown, kind, f"{s['entropy']:.3f}"] + [f"{s[k]:.2f}" for k in stats_cols] + [
                    f"{s['l0_z_score']:.3f}"]
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
            f, w = res["full"], res["window"]
            heads.append(f"| {label} | {shown} | " + " / ".join(f"{v:.2f}" for v in f["heads"]) + " | "
                         + " / ".join(f"{v:.3f}" for v in f["head_z"]) + " | "
                         + " / ".join(f"{v:.3f}" for v in w["line_word"])
                         + f" | {w['line_word_uniform']:.3f} | " + " / ".join(f"{v:.2f}" for v in w["markers"])
                         + f" | {f['l0_z_score']:.3f} / {f['z_top_uniform']:.3f} (head {f['top_head']}) / "
                         f"{f['z_others_uniform']:.3f} / {f['z_all_uniform']:.3f} | {w['l0_z_score']:.3f} / "
                         f"{w['z_top_uniform']:.3f} / {w['z_others_uniform']:.3f} / {w['z_all_uniform']:.3f} |")
    text = "\n".join(lines + heads) + "\n"
    print("\n".join(heads))
    if args.figure:
        figure(per_run, args.figure)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
