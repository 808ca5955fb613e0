# Two commands do all the set-up on a fresh machine with python3.11 and make:
#   make train  — the main job (creates .venv when missing)
#   make test   — the test suite, slow tests only with CI=1 (creates .venv when missing)
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: train demo test lock clean

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/bepo-jax train --env sokoban --estimator gated_bepo --out runs/sokoban_gated_bepo_s0$(if $(wildcard runs/sokoban_gated_bepo_s0/config.json), --resume,)
	cp runs/sokoban_gated_bepo_s0/summary.json experiments/results/main_job.json

demo: $(VENV)/.installed
	$(VENV)/bin/bepo-jax demo

# Tests marked slow run when CI is set (.ci/run exports CI=1): `CI=1 make test` runs everything.
test: $(VENV)/.installed
	$(PY) -m pytest -n 2 -q $(if $(CI),,-m "not slow")
	BEPO_NB_ITERATIONS=2 BEPO_NB_GROUPS=16 $(PY) -m pytest -n 2 -q --nbmake notebooks/*.ipynb

# Re-lock after changing dependencies in pyproject.toml.
lock:
	rm -rf .lockvenv && $(PYTHON) -m venv .lockvenv
	.lockvenv/bin/pip install --quiet --upgrade pip
	.lockvenv/bin/pip install --quiet ".[dev]"
	.lockvenv/bin/pip freeze --exclude bepo-jax | grep -v '^-e' > requirements.lock
	rm -rf .lockvenv

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
