"""Pack the GPU session's results for the trip back: every small file of the runs and analyses in
results.tar.gz, and the final weights at float16 (settings stamp kept) of as many runs as fit beside it, in
parts of at most 15 MiB (the device tool brings back at most 8 files, 64 MiB in all).
Usage: python3 gpu_pack.py RUNS_DIR ANALYSIS_DIR OUT"""

import io
import sys
import tarfile
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save

runs, ana, out = (Path(a) for a in sys.argv[1:4])
with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
    for path in sorted([*runs.rglob("*"), *ana.rglob("*")]):
        if path.is_file() and path.suffix not in (".safetensors", ".pt") and path.name != "plotly.min.js":
            tar.add(path, arcname=str(path).lstrip("/"))
budget = 60 * 2**20 - (out / "results.tar.gz").stat().st_size
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as tar:
    for task in ("reversal", "addition", "ordering", "indexing"):
        path = runs / task / "model.safetensors"
        if not path.is_file():
            continue
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            data = save({k: f.get_tensor(k).half() for k in f.keys()}, metadata=meta)
        if buf.tell() + len(data) + 2048 > budget:
            print(f"{task}: weights left behind (no room)")
            continue
        info = tarfile.TarInfo(f"{task}/model.float16.safetensors")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        print(f"{task}: weights packed ({len(data) / 2**20:.1f} MiB)")
blob = buf.getvalue()
part = 15 * 2**20
for i in range(0, len(blob), part):
    (out / f"weights.tar.part{i // part}").write_bytes(blob[i:i + part])
print(f"packed: results.tar.gz and {(len(blob) + part - 1) // part} weight parts in {out}")
