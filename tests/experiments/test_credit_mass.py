"""experiments/credit_mass.py: how much of each batch an arm's estimator credits (the effective sample size)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bepo_jax.agent.train import load_run
from bepo_jax.credit.reference import ref_grpo
from experiments import credit_mass
from experiments.claims import EXPERIMENTS, arm_config, base_config
from tests.helpers import reference_batch

# One worker runs this module and the claims smoke test (--dist loadgroup): conftest's e1_smoke runs are
# trained once, not once per worker.
pytestmark = pytest.mark.xdist_group("e1_smoke")

GRPO = dict(norm="mean_std", weighting="step", std="unbiased", eps=1e-6)  # GRPOConfig's defaults


def plain_numbers(adv, mask, success) -> tuple[float, float, float]:
    """Credit mass, mean |A| and mixed-group share by loops over the records and groups."""
    B, K, T = mask.shape
    records = [(b, k, t) for b in range(B) for k in range(K) for t in range(T) if mask[b, k, t]]
    mass = sum(abs(adv[r]) > 1e-6 for r in records) / len(records)
    mean_abs = sum(abs(adv[r]) for r in records) / len(records)
    mixed = sum(0 < sum(success[b]) < K for b in range(B)) / B
    return mass, mean_abs, mixed


def grpo_by_loops(setup, state, seed: int, batches: int) -> np.ndarray:
    """GRPO's numbers on the documented batches (MASS_KEY + seed, folded with the batch index), averaged."""
    tasks = jax.tree_util.tree_map(jnp.asarray, setup.train_tasks)
    roll, rows = jax.jit(setup.rollout_fn), []
    for b in range(batches):
        ro = roll(state, tasks, jax.random.fold_in(jax.random.PRNGKey(credit_mass.MASS_KEY + seed), b))
        adv = ref_grpo(reference_batch(ro.batch), **GRPO)
        rows.append(plain_numbers(adv, np.asarray(ro.batch.mask), np.asarray(ro.success)))
    return np.mean(rows, axis=0)


@pytest.mark.slow  # needs the trained runs (the fixture): CI=1 runs it
def test_credit_mass_measures_the_initial_and_final_policies_batches(e1_smoke, monkeypatch, tmp_path):
    args = ["--experiment", "e1", "--arms", "grpo,gated_bepo", "--seeds", "2", "--iterations", "2", "--groups", "2",
            "--eval-tasks", "4", "--batches", "2", "--out", str(e1_smoke / "runs"), "--results", str(tmp_path)]
    info = credit_mass.main(args)
    assert [s["seed"] for s in info["per_seed"]] == [0, 1] and info["optimizer_steps"] == 2
    # GRPO at the final policy: the run's own setup and checkpoint (load_run), the documented keys, the plain loop
    setup, state, it = load_run(e1_smoke / "runs" / "e1" / "grpo" / "seed0")
    assert it == 2
    final = info["per_seed"][0]["final"]["grpo"]
    assert final["mass"] > 0  # some group of these batches has both outcomes (else this checks only zeros)
    np.testing.assert_allclose([final["mass"], final["mean_abs"], final["mixed"]],
                               grpo_by_loops(setup, state, 0, 2), rtol=1e-5)
    # at the initial policy: the seed's fresh state, every arm's estimator on the same batches
    setup, state, _ = load_run(e1_smoke / "runs" / "e1" / "grpo" / "seed1")
    init = info["per_seed"][1]["initial"]
    assert init["grpo"]["mass"] > 0
    np.testing.assert_allclose([init["grpo"]["mass"], init["grpo"]["mean_abs"], init["grpo"]["mixed"]],
                               grpo_by_loops(setup, setup.init_state(), 1, 2), rtol=1e-5)
    assert init["gated_bepo"]["mixed"] == init["grpo"]["mixed"]  # the same batches
    # another arm's checkpoint, restored into the first arm's setup: its batches as its own run rolls them out
    setup, state, _ = load_run(e1_smoke / "runs" / "e1" / "gated_bepo" / "seed1")
    mixed = info["per_seed"][1]["final"]["gated_bepo"]["mixed"]
    assert mixed > 0 and mixed == pytest.approx(grpo_by_loops(setup, state, 1, 2)[2])
    # the summary is over the seeds' numbers
    for k in ("mass", "mean_abs"):
        assert info["summary"]["gated_bepo"]["initial"][k][0] == pytest.approx(
            np.mean([s["initial"]["gated_bepo"][k] for s in info["per_seed"]]))
    md = (tmp_path / "e1_credit_mass.md").read_text()
    assert "Every arm takes 2 optimizer steps" in md and "| gated_bepo |" in md
    # resumable: measured seeds are read back, not measured again; another measurement is refused
    monkeypatch.setattr(credit_mass, "measure_seed", lambda *a, **k: pytest.fail("measured again"))
    assert credit_mass.main(args)["per_seed"] == info["per_seed"]
    with pytest.raises(SystemExit, match="holds another measurement"):
        credit_mass.main([*args[:args.index("--batches") + 1], "3", *args[args.index("--batches") + 2:]])
    assert json.loads((tmp_path / "e1_credit_mass.json").read_text())["per_seed"] == info["per_seed"]


def test_credit_mass_refuses_what_it_cannot_measure(tmp_path):
    common = ["--iterations", "2", "--groups", "2", "--eval-tasks", "4", "--out", str(tmp_path / "none"),
              "--results", str(tmp_path)]
    with pytest.raises(SystemExit, match="not a finished run"):
        credit_mass.main(["--experiment", "e1", "--arms", "grpo", "--seeds", "1", *common])
    with pytest.raises(SystemExit, match="names arms"):
        credit_mass.main(["--experiment", "e1", "--arms", "grpo,nope", *common])
    with pytest.raises(SystemExit, match="at least 1 batch"):
        credit_mass.main(["--experiment", "e1", "--batches", "0", *common])
    # arms whose batches differ (another policy or update) are not compared on the same batches
    base = base_config(EXPERIMENTS["e1"], {}, 2)
    grpo = arm_config(base, next(a for a in EXPERIMENTS["e1"].arms if a.label == "grpo"))
    assert credit_mass.same_policy_and_update(grpo.replace(estimator="gigpo"), base)
    assert not credit_mass.same_policy_and_update(dataclasses.replace(grpo, learning_rate=grpo.learning_rate * 2), base)
