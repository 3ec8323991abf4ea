# Two commands a new user needs: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of torch is pinned so that pip never pulls a multi-GB CUDA build on a CPU machine.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test reproduce clean-venv

$(BIN)/nope-interp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(BIN)/nope-interp

venv: $(BIN)/nope-interp

demo: venv
	$(BIN)/nope-interp demo

test: venv
	$(BIN)/ruff check nope_interp tasks tests bench
	NOPE_FAST=1 $(BIN)/python -m pytest -q tests notebooks --nbmake --nbmake-timeout=900

reproduce: venv
	$(BIN)/nope-interp demo --retrain

clean-venv:
	rm -rf $(VENV)
