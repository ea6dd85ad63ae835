# make run  : create .venv (CPU stack), then shard the default task (prints a plan, writes plan.json)
# make test : create .venv, then run the test suite
# make compare : every searcher over the suite (experiment=compare), every plan measured, compare.md + plots
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SEARCHER ?= beam
ARGS ?=
SWEEP ?= multirun/compare/default

.PHONY: run test compare lint clean

# pip's output goes to $(VENV)/install.log, shown only if a step fails (then make stops with pip's exit status)
$(VENV)/.installed: pyproject.toml
	@echo "installing $(VENV) (a few minutes; pip's log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install --upgrade pip \
	  && $(PY) -m pip install -e '.[cpu,dev,torchrec,report]' \
	  && $(PY) -m pip install --no-deps torchrec==1.8.0; } > $(VENV)/install.log 2>&1 \
	  || { status=$$?; tail -n 50 $(VENV)/install.log; echo "error: installing $(VENV) failed, full log: $(VENV)/install.log" >&2; exit $$status; }
	@touch $@

run: $(VENV)/.installed
	$(PY) -m neuroshard_jax searcher=$(SEARCHER) $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest $(ARGS)

compare: $(VENV)/.installed
	$(PY) -m neuroshard_jax -m experiment=compare hydra.sweep.dir=$(SWEEP) $(ARGS)
	$(PY) -m neuroshard_jax.evaluate sweep=$(SWEEP) executor.workers=2
	$(PY) -m neuroshard_jax.compare sweep=$(SWEEP)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check neuroshard_jax searchers tests tools

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
