"""Per-layer hook_z score and recency gap of tiny randomly initialised Hugging Face models (SmolLM3 with
RoPE left out of layers 3 and 7, SmolLM3 without RoPE, Llama), 8 layers, 3 seeds, random tokens (README,
"Any TransformerLens model"). Run: OMP_NUM_THREADS=1 .venv/bin/python docs/measured/scripts/hybrid_init.py [OUT]
(the result files and figures go under OUT, default /tmp/hybrid_init).
"""
import sys
import torch
torch.set_num_threads(1)
from nope_interp.hf import tiny_hf_model, bridge_from_hf
from nope_interp.positional import layer_positional_types
from nope_interp.jobs import long_context
from nope_interp.jobs.common import ModelEntry
import tasks
entries=[]
for kind in ("smollm3-mixed","smollm3-nope","llama"):
    for seed in (0,1,2):
        b=bridge_from_hf(tiny_hf_model(kind, seed=seed, n_layers=8, d_model=128, vocab=4096, n_ctx=1024))
        entries.append(ModelEntry(label=f"{kind}-s{seed}", kind="hf", model=b, model_cfg=None, task=tasks.get_task("reversal")))
cfg=long_context.LongContextConfig(lengths=(64,256,1024), inputs=("random",), n_sequences=2, points=("z",))
res=long_context.run(cfg, entries)
import collections
agg=collections.defaultdict(list)
for r in res.rows:
    for i,site in enumerate(r.sites):
        agg[(r.model.rsplit('-s',1)[0], r.n, i, r.layer_types[i])].append((r.scores[site]['row_mean']['mean'], r.scores[site]['recency_gap']['mean']))
for k,v in sorted(agg.items()):
    import statistics
    print(k, round(statistics.mean(x for x,_ in v),3), round(statistics.mean(g for _,g in v),3))
for path in long_context.write(res, sys.argv[1] if len(sys.argv) > 1 else "/tmp/hybrid_init"):
    print("wrote", path)
