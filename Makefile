# make run  : create .venv (CPU stack), then shard the default task (prints a plan, writes plan.json)
# make test : create .venv, then run the test suite
# make test-fast : the tests marked fast (pytest -m fast), minutes: what to run before a commit
# make compare : every searcher over the suite (experiment=compare), every plan measured, compare.md + plots
# make test-newest : the newest supported torch / FBGEMM / TorchRec (requirements/newest.txt) installed first, as a
#                    user's environment holds them, this package into it, and the tests of the worker, the adapter,
#                    export and DistributedModelParallel (NEWEST_TESTS)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NEWEST ?= .venv-newest
NEWEST_PY := $(NEWEST)/bin/python
NEWEST_TESTS ?= tests/test_profiling.py tests/test_torchrec_planner.py tests/test_torchrec.py tests/test_export.py tests/test_data_parallel.py tests/test_tiers.py
# TorchRec's other dependencies (it goes in with --no-deps: its metadata wants the CUDA fbgemm-gpu)
TORCHREC_DEPS := tensordict torchmetrics==1.0.3 pyre-extensions iopath
SEARCHER ?= beam
ARGS ?=
SWEEP ?= multirun/compare/default

.PHONY: run test test-fast test-newest compare lint clean

# pip's output goes to $(VENV)/install.log, shown only if a step fails (then make stops with pip's exit status)
$(VENV)/.installed: pyproject.toml requirements/default.txt
	@echo "installing $(VENV) (a few minutes; pip's log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install --upgrade pip \
	  && $(PY) -m pip install -c requirements/default.txt -e '.[cpu,dev,torchrec,report]' \
	  && $(PY) -m pip install --no-deps -c requirements/default.txt torchrec; } > $(VENV)/install.log 2>&1 \
	  || { status=$$?; tail -n 50 $(VENV)/install.log; echo "error: installing $(VENV) failed, full log: $(VENV)/install.log" >&2; exit $$status; }
	@touch $@

run: $(VENV)/.installed
	$(PY) -m neuroshard_jax searcher=$(SEARCHER) $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest $(ARGS)

# before a commit: the tests marked fast (pure Python, one real worker smoke), about 3 minutes on 2 cores
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m fast $(ARGS)

# the user's stack first (torch, FBGEMM, TorchRec of requirements/newest.txt), then this package without constraints:
# pip keeps what the ranges allow; versions.txt shows what the environment ended with
$(NEWEST)/.installed: pyproject.toml requirements/newest.txt
	@echo "installing $(NEWEST) (several minutes; pip's log: $(NEWEST)/install.log)"
	@$(PYTHON) -m venv $(NEWEST)
	@{ $(NEWEST_PY) -m pip install --upgrade pip \
	  && $(NEWEST_PY) -m pip install $$(grep -E '^(torch|fbgemm-gpu-cpu)==' requirements/newest.txt) \
	  && $(NEWEST_PY) -m pip install --no-deps $$(grep -E '^torchrec==' requirements/newest.txt) \
	  && $(NEWEST_PY) -m pip install $(TORCHREC_DEPS) \
	  && $(NEWEST_PY) -m pip freeze | grep -E '^(torch|fbgemm|torchrec)[=_-]' > $(NEWEST)/before.txt \
	  && $(NEWEST_PY) -m pip install -e '.[cpu,dev,torchrec]' \
	  && $(NEWEST_PY) -m pip freeze | grep -E '^(torch|fbgemm|torchrec|jax|flax)[=_-]' > $(NEWEST)/versions.txt \
	  && diff <(grep -E '^(torch|fbgemm|torchrec)[=_-]' $(NEWEST)/versions.txt) $(NEWEST)/before.txt; } \
	  > $(NEWEST)/install.log 2>&1 \
	  || { status=$$?; tail -n 50 $(NEWEST)/install.log; echo "error: installing $(NEWEST) failed (or changed the user's torch / FBGEMM / TorchRec), full log: $(NEWEST)/install.log" >&2; exit $$status; }
	@touch $@

test-newest: $(NEWEST)/.installed
	@cat $(NEWEST)/versions.txt
	$(NEWEST_PY) -m pytest $(NEWEST_TESTS) $(ARGS)

compare: $(VENV)/.installed
	$(PY) -m neuroshard_jax -m experiment=compare hydra.sweep.dir=$(SWEEP) $(ARGS)
	$(PY) -m neuroshard_jax.evaluate sweep=$(SWEEP) executor.workers=2
	$(PY) -m neuroshard_jax.compare sweep=$(SWEEP)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check neuroshard_jax searchers tests tools

clean:
	rm -rf $(VENV) $(NEWEST) outputs multirun .pytest_cache
