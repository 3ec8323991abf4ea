"""Layer 0's hook_z adjacency through training for every saved trajectory in docs/measured/trajectory/ (a column
per task, a line per run, dash = objective), from the result files alone (no weights needed).

Run: .venv/bin/python docs/measured/scripts/trajectory_figure.py [OUT]   (default OUT: /tmp/trajectory_figure)
Writes OUT/trajectory_l0_z.html; docs/measured/trajectory/trajectory_l0_z.png is its screenshot.
"""
import sys
from pathlib import Path

from nope_interp.jobs.trajectory import load_trajectory, plot_site_by_objective
from nope_interp.plotting import save_figure

here = Path(__file__).resolve().parents[1] / "trajectory"
order = {"reversal": 0, "addition": 1, "indexing": 2, "ordering": 3}
runs = sorted((load_trajectory(p) for p in here.glob("*.json")), key=lambda r: (order.get(r.task, 9), r.objective))
if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
    sys.exit(__doc__)
out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/trajectory_figure")
print("wrote", save_figure(plot_site_by_objective(runs), out / "trajectory_l0_z.html"))
