"""Compare the result files of two output roots: same files, same keys, same numbers.

Used to check that a refactor changes no result: run the same commands with ``--out-root A`` on the old
code and ``--out-root B`` on the new, then

    .venv/bin/python bench/compare_outputs.py A B [--rtol 1e-9] [--rename OLD=NEW ...]

Every ``results/**/*.json`` and ``*.csv`` (and ``*.md``) under A must exist under B with the same
structure and values. Ignored: provenance (``git_commit``, ``nope_interp_version``), wall times, and
the output root inside path strings. ``--rename`` maps a documented key renaming (old key = new key).
Prints one line per file and exits 1 on any difference.
"""

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

IGNORED = {"git_commit", "nope_interp_version", "wall_time_s", "torch_threads"}
ALLOW_NEW_KEYS = False  # set by --allow-new-keys: keys added by the new code (new config fields) are not differences


def _num(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def _close(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol)
    return a == b


def diff(a: Any, b: Any, path: str, roots: tuple[str, str], rtol: float, rename: dict[str, str]) -> list[str]:
    """Differences between two JSON values (a list of one-line descriptions)."""
    if isinstance(a, dict) and isinstance(b, dict):
        a = {rename.get(k, k): v for k, v in a.items() if k not in IGNORED}
        b = {k: v for k, v in b.items() if k not in IGNORED}
        out = [f"{path}: key {k!r} only in the old output" for k in a if k not in b]
        out += [f"{path}: key {k!r} only in the new output" for k in b if k not in a and not ALLOW_NEW_KEYS]
        for k in a:
            if k in b:
                out += diff(a[k], b[k], f"{path}.{k}", roots, rtol, rename)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in diff(x, y, f"{path}[{i}]", roots, rtol, rename)]
    if isinstance(a, str) and isinstance(b, str):
        a, b = _renamed(a.replace(roots[0], "<root>"), rename), b.replace(roots[1], "<root>")
    return [] if _close(a, b, rtol) else [f"{path}: {a!r} vs {b!r}"]


def _renamed(text: str, rename: dict[str, str]) -> str:
    for old, new in rename.items():
        text = text.replace(old, new)
    return text


def compare_csv(pa: Path, pb: Path, roots: tuple[str, str], rtol: float, rename: dict[str, str]) -> list[str]:
    """Cell-by-cell comparison of two CSV files (numbers with tolerance)."""
    ra, rb = list(csv.DictReader(pa.open())), list(csv.DictReader(pb.open()))
    ra = [{rename.get(k, k): v for k, v in r.items() if k not in IGNORED} for r in ra]
    rb = [{k: v for k, v in r.items() if k not in IGNORED} for r in rb]
    if len(ra) != len(rb):
        return [f"{len(ra)} vs {len(rb)} rows"]
    out = []
    for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
        if set(x) != set(y):
            return [f"columns differ: {sorted(set(x) ^ set(y))}"]
        for k in x:
            nx, ny = _num(x[k]), _num(y[k])
            if nx is not None and ny is not None:
                if not _close(nx, ny, rtol):
                    out.append(f"row {i} {k}: {x[k]} vs {y[k]}")
            elif _renamed(x[k].replace(roots[0], "<root>"), rename) != y[k].replace(roots[1], "<root>"):
                out.append(f"row {i} {k}: {x[k]!r} vs {y[k]!r}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rtol", type=float, default=1e-9)
    parser.add_argument("--rename", nargs="*", action="extend", default=[], help="OLD=NEW key renamings (repeatable)")
    parser.add_argument("--allow-new-keys", action="store_true", help="keys only in the new output are additions")
    parser.add_argument("--move", nargs="*", action="extend", default=[],
                        help="OLD_PATH=NEW_PATH: a result file that moved (relative to the roots)")
    args = parser.parse_args()
    old, new = Path(args.old), Path(args.new)
    global ALLOW_NEW_KEYS
    ALLOW_NEW_KEYS = args.allow_new_keys
    rename = dict(r.split("=", 1) for r in args.rename)
    moves = dict(m.split("=", 1) for m in args.move)
    roots = (str(old.resolve()), str(new.resolve()))
    bad = 0
    files = sorted(p for p in (old / "results").rglob("*") if p.suffix in (".json", ".csv"))
    for pa in files:
        rel = pa.relative_to(old)
        pb = new / moves.get(rel.as_posix(), rel.as_posix())
        if not pb.exists():
            print(f"MISSING {rel}")
            bad += 1
            continue
        if pa.suffix == ".json":
            problems = diff(json.loads(pa.read_text()), json.loads(pb.read_text()), "", roots, args.rtol, rename)
        else:
            problems = compare_csv(pa, pb, roots, args.rtol, rename)
        print(("same     " if not problems else "DIFFERS  ") + str(rel))
        for p in problems[:10]:
            print(f"    {p}")
        bad += bool(problems)
    print(f"{len(files) - bad} of {len(files)} result files equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
