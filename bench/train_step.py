"""Benchmark: one training step of our NoPE HookedTransformer vs a plain PyTorch model of the same shape.

The plain model: token embedding, pre-LayerNorm blocks with fused attention
(``torch.nn.functional.scaled_dot_product_attention``, causal), GELU MLP, no biases, no positions, and
an unembedding: the same parameter count as ours (minus TransformerLens's frozen zero biases). All take
AdamW steps on the same batch: 64 sequences of 24 tokens (the answer-only objective's prompts) and of
``--packed-len`` tokens (the packed objective's windows). Columns: ``hooked`` = the HookedTransformer's own
forward with PyTorch's default AdamW (the trainer before the fast path); ``trainer`` = what
``nope-interp train`` runs now (:func:`nope_interp.fast_forward.fast_logits` and
:func:`nope_interp.train.make_optimizer`); ``plain`` = the reference. Target: trainer / plain <= 1.15 at
both presets and both lengths. With --compile, also ``torch.compile`` of the hooked model.
Usage: .venv/bin/python bench/train_step.py [--presets cpu paper] [--packed-len 64] [--compile] [--device cpu|cuda]
"""

import argparse
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


class PlainBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_mlp: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model, bias=False), nn.LayerNorm(d_model, bias=False)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.w_in, self.w_out = nn.Linear(d_model, d_mlp, bias=False), nn.Linear(d_mlp, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, p, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, p, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, p, d)
        x = x + self.out(z)
        return x + self.w_out(F.gelu(self.w_in(self.ln2(x))))


class PlainNoPE(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.blocks = nn.ModuleList(PlainBlock(cfg.d_model, cfg.n_heads, cfg.d_mlp) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.unembed(self.ln_f(x))


def _time_steps(model: nn.Module, forward, tokens, targets, steps: int, device: str, opt=None) -> float:
    opt = opt or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times = []
    for i in range(steps + 3):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = F.cross_entropy(forward(tokens).flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    from nope_interp.config import TrainConfig
    from nope_interp.fast_forward import fast_logits
    from nope_interp.model import build_model, preset
    from nope_interp.train import make_optimizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["cpu", "paper"])
    parser.add_argument("--packed-len", type=int, default=64, help="tokens per packed window (0: skip)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the hooked model")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(f"training-step benchmark, batch 64, device {args.device}, threads {torch.get_num_threads()}")
    print(f"{'preset':>7} {'tokens':>6} {'hooked ms':>9} {'trainer ms':>10} {'plain ms':>9} {'hooked/plain':>12} "
          f"{'trainer/plain':>13} {'compiled ms':>12}")
    lengths = [24] + ([args.packed_len] if args.packed_len else [])
    for name in args.presets:
        cfg = preset(name)
        for seq in lengths:
            gen = torch.Generator().manual_seed(0)
            tokens = torch.randint(0, cfg.d_vocab, (64, seq), generator=gen).to(args.device)
            targets = torch.randint(0, cfg.d_vocab, (64, seq), generator=gen).to(args.device)
            ours = build_model(cfg, device=args.device)
            ours.train()
            t_hooked = _time_steps(ours, partial(ours, return_type="logits"), tokens, targets, args.steps, args.device)
            ours = build_model(cfg, device=args.device)
            ours.train()
            t_trainer = _time_steps(ours, partial(fast_logits, ours), tokens, targets, args.steps, args.device,
                                    make_optimizer(ours, TrainConfig(lr=1e-4)))
            torch.manual_seed(0)
            plain = PlainNoPE(cfg).to(args.device)
            t_plain = _time_steps(plain, plain, tokens, targets, args.steps, args.device)
            compiled = "-"
            if args.compile:
                t0 = time.perf_counter()
                fast = torch.compile(ours)
                t_comp = _time_steps(ours, partial(fast, return_type="logits"), tokens, targets, args.steps,
                                     args.device)
                compiled = f"{t_comp * 1000:.1f} (+{time.perf_counter() - t0:.0f}s)"
            print(f"{name:>7} {seq:>6} {t_hooked * 1000:>9.1f} {t_trainer * 1000:>10.1f} {t_plain * 1000:>9.1f} "
                  f"{t_hooked / t_plain:>11.2f}x {t_trainer / t_plain:>12.2f}x {compiled:>12}", flush=True)


if __name__ == "__main__":
    main()
