# Two commands a new user needs: `make demo` and `make test`. Each creates .venv on first use.
# `make notebooks` adds JupyterLab (the `notebook` extra) and opens notebooks/.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned. On a machine without nvidia-smi, the CPU build is taken from PyTorch's CPU index when
# that index is reachable; otherwise (as on this project's machines, where the CPU wheel of 2.13.0 lies on
# disk for pip) plain pip is used.
TORCH_SPEC ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: venv demo test notebooks reproduce clean-venv

$(BIN)/nope-interp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1 && $(BIN)/python -c "import urllib.request; \
	    urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" --index-url $(TORCH_CPU_INDEX); \
	else \
	  $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"; \
	fi
	$(BIN)/python -m pip install --quiet -e ".[dev,ray,hf,text]"
	touch $(BIN)/nope-interp

venv: $(BIN)/nope-interp

demo: venv
	$(BIN)/nope-interp demo

test: venv
	$(BIN)/ruff check nope_interp tasks tests bench
	OMP_NUM_THREADS=1 NOPE_FAST=1 $(BIN)/python -m pytest -q tests notebooks --nbmake --nbmake-timeout=900

notebooks: venv
	$(BIN)/python -m pip install --quiet -e ".[notebook]"
	$(BIN)/jupyter lab notebooks/

# The shipped recipes as a sweep (4 tasks x 3 seeds, resumable; see README "Sweeps"), its seed table, then
# the demo on each task's seed-0 model of that sweep.
reproduce: venv
	$(BIN)/nope-interp sweep trained-seeds --workers 2
	$(BIN)/nope-interp sweep-report trained-seeds
	$(BIN)/nope-interp demo --from-sweep trained-seeds

clean-venv:
	rm -rf $(VENV)
