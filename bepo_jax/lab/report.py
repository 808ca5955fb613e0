"""Sweeps of the credit lab and their reports (``bepo-jax credit``).

``run_sweep`` runs ``credit_quality`` for every (horizon, policy temperature, group size
K) of a ``SweepConfig`` and writes ``credit.json`` after each one, so an interrupted
sweep resumes where it stopped (same settings) and a changed one refuses to mix
results. ``write_outputs`` renders ``credit.md`` and the plots.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..credit.configs import check_int
from ..agent.envs.diagnostic import DIAGNOSTIC_ENVS, make_diagnostic
from .exact import boltzmann_policy, uniform_policy
from .model import TabularModel, enumerate_states
from .quality import DEFAULT_SUITE, ORACLE, EstimatorSpec, LabConfig, credit_quality, parse_spec

LAB_ENVS = tuple(DIAGNOSTIC_ENVS) + ("sokoban", "maze")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """env: a diagnostic world, "sokoban" (6x6, 1-2 boxes), "maze" (Jumanji 5x5), any other
    JAX environment the registry knows (``sokoban_hard``, a ``register_env`` name) or an
    import path ``package.module:factory`` (the factory gets the run defaults, ``RunConfig()``).
    estimators: specs as ``parse_spec`` reads them. group_sizes (2, 4, 8, 16).
    temperatures: Boltzmann temperatures over Q* (reward units); "inf" = uniform.
    horizons: time limits (empty = the environment's). tasks: levels for sokoban/maze
    (8). groups, batches, seed: ``LabConfig``."""

    env: str = "key_door"
    estimators: tuple = tuple(s.label for s in DEFAULT_SUITE)
    group_sizes: tuple = (2, 4, 8, 16)
    temperatures: tuple = ("inf",)
    horizons: tuple = ()
    tasks: int = 8
    groups: int = 32
    batches: int = 8
    seed: int = 0

    def __post_init__(self):
        n = "SweepConfig"
        from ..agent.envs.registry import check_env_name, is_host_env

        check_env_name(self.env)  # unknown names raise, listing the valid ones
        if is_host_env(self.env):
            raise ValueError(f"{n}.env={self.env!r} is a host environment; the lab enumerates JAX environments "
                             f"({', '.join(LAB_ENVS)}, or an import path 'package.module:factory').")
        if not self.estimators:
            raise ValueError(f"{n}.estimators is empty; name at least one estimator.")
        for e in self.estimators:
            parse_spec(e)
        for k in self.group_sizes:
            check_int(n, "group_sizes", k, lo=2)
        for t in self.temperatures:
            if t != "inf" and not (isinstance(t, (int, float)) and t > 0):
                raise ValueError(f"{n}.temperatures holds {t!r}; give positive numbers or 'inf' (uniform).")
        for h in self.horizons:
            check_int(n, "horizons", h, lo=1)
        check_int(n, "tasks", self.tasks, lo=1)
        LabConfig(group_size=2, num_groups=self.groups, num_batches=self.batches, seed=self.seed)

    def specs(self) -> list[EstimatorSpec]:
        return [parse_spec(e) for e in self.estimators]


def lab_env(name: str):
    """A lab environment by name: a diagnostic world, a JAX environment of the registry, or an
    import path (``envs.registry.make_jax_env`` with the run defaults)."""
    from ..agent.envs.registry import make_jax_env
    from ..agent.train.config import RunConfig

    return make_diagnostic(name) if name in DIAGNOSTIC_ENVS else make_jax_env(name, RunConfig())


def lab_models(env_name: str, tasks: int, horizon: Optional[int], seed: int) -> list[TabularModel]:
    """The models of the sweep's tasks (one for a diagnostic world)."""
    import jax

    env = lab_env(env_name)
    n = 1 if env_name in DIAGNOSTIC_ENVS else tasks
    levels = env.sample_tasks(n, seed)
    return [enumerate_states(env, jax.tree_util.tree_map(lambda x: x[i], levels), horizon) for i in range(n)]


def policies(models: Sequence[TabularModel], temperature) -> list[np.ndarray]:
    if temperature == "inf":
        return [uniform_policy(m) for m in models]
    return [boltzmann_policy(m, float(temperature)) for m in models]


def _settings(cfg: SweepConfig) -> dict:
    return dataclasses.asdict(cfg) | {"estimators": list(cfg.estimators), "group_sizes": list(cfg.group_sizes),
                                      "temperatures": list(cfg.temperatures), "horizons": list(cfg.horizons)}


def run_sweep(cfg: SweepConfig, out: str | Path, *, progress: bool = True) -> dict:
    """Every (horizon, temperature, K) of ``cfg``; ``out/credit.json`` after each."""
    import jax

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "credit.json"
    settings = _settings(cfg)
    results = {"settings": settings, "rows": []}
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("settings") != settings:
            raise ValueError(f"{path} holds a sweep with other settings; pass another --out or remove that file "
                             "(finished rows are reused only when every setting is the same).")
        results = stored
    done = {(r["horizon"], r["temperature"], r["group_size"]) for r in results["rows"]}
    horizons = list(cfg.horizons) or [None]
    todo = [(h, t, k) for h in horizons for t in cfg.temperatures for k in cfg.group_sizes]
    bar = _Bar(len(todo) * cfg.batches, f"credit {cfg.env}") if progress else None
    specs = cfg.specs()
    for h in horizons:
        models = None
        for temp in cfg.temperatures:
            probs = None
            for k in cfg.group_sizes:
                models = models or lab_models(cfg.env, cfg.tasks, h, cfg.seed)
                horizon = models[0].horizon
                if (horizon, temp, k) in done or (h, temp, k) in done:
                    if bar is not None:
                        bar.update(cfg.batches)
                    continue
                probs = probs or policies(models, temp)
                lab = LabConfig(group_size=k, num_groups=cfg.groups, num_batches=cfg.batches, seed=cfg.seed)
                res = credit_quality(models, probs, specs, lab, progress=bar.update if bar is not None else None)
                results["rows"].append({"horizon": horizon, "temperature": temp, "group_size": k, **res})
                results["machine"] = {"python": platform.python_version(), "jax": jax.__version__,
                                      "platform": platform.platform(), "backend": jax.default_backend()}
                tmp = path.with_suffix(".json.tmp")
                tmp.write_text(json.dumps(results, indent=1))
                tmp.replace(path)
                # XLA:CPU maps every compiled program into memory; a long sweep of shapes would
                # exhaust the process's map count (vm.max_map_count) without this.
                jax.clear_caches()
    if bar is not None:
        bar.close()
    return results


class _Bar:
    """A progress bar of batches (rich, the one progress library of the package): ``update(n)``, ``close()``."""

    def __init__(self, total: int, description: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn())
        self._task = self._progress.add_task(description, total=total)
        self._progress.start()

    def update(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)

    def close(self) -> None:
        self._progress.stop()


# ------------------------------------------------------------------------------ rendering


def _fmt(cell: dict, digits: int = 3) -> str:
    m, h = cell["mean"], cell["ci95"]
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "n/a"
    return f"{m:.{digits}f}" + ("" if h is None or math.isnan(h) else f" ± {h:.{digits}f}")


def markdown(results: dict, *, metrics: Sequence[str] = ("pearson", "grad_cos", "affine_err", "sign_acc"),
             command: str = "") -> str:
    s = results["settings"]
    lines = [f"# Credit lab: {s['env']}", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [f"Every cell: mean over {s['batches']} independent batches of {s['groups']} groups "
              "± the 95% Student-t half-width over those batches. The truth is the exact advantage "
              "A^pi_t(s_t, a_t) of the sampling policy (gamma = 1); `oracle` is that truth itself.", ""]
    for (h, temp), rows in _by_setting(results["rows"]).items():
        r0 = rows[0]
        pol = "uniform" if temp == "inf" else f"Boltzmann over Q*, temperature {temp}"
        lines += [f"## horizon {h}, policy {pol}", "",
                  f"{r0['tasks']} task(s), states per task {r0['num_states']}; exact success probability "
                  f"{r0['true_success']:.3f}; gated share of records (Gated-BEPO default gate) by K: "
                  + ", ".join(f"K={r['group_size']}: {r['gated_share']['mean']:.2f}" for r in rows) + ".", ""]
        labels = list(r0["estimators"])
        for metric in metrics:
            lines += [f"**{metric}**", "", "| estimator | " + " | ".join(f"K={r['group_size']}" for r in rows) + " |",
                      "|---|" + "---|" * len(rows)]
            for lab in labels:
                lines.append(f"| {lab} | " + " | ".join(_fmt(r["estimators"][lab][metric]) for r in rows) + " |")
            lines.append("")
        lines += ["**values** (RMSE against the exact V^pi at gamma 0.95; fp - mc paired per batch)", "",
                  "| K | MC means | fixed point | fp - mc |", "|---|---|---|---|"]
        for r in rows:
            v = r["values"]
            lines.append(f"| {r['group_size']} | {_fmt(v['rmse_mc'])} | {_fmt(v['rmse_fp'])} | "
                         f"{_fmt(v['fp_minus_mc'])} |")
        lines.append("")
    lines.append("Estimator configs: " + "; ".join(
        f"`{lab}` = {spec}" for lab, spec in
        ((lab, e["spec"]) for lab, e in results["rows"][0]["estimators"].items())) if results["rows"] else "")
    return "\n".join(lines) + "\n"


def _by_setting(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["horizon"], r["temperature"]), []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["group_size"])
    return out


def plot(results: dict, path: str | Path) -> None:
    """Pearson and gradient cosine vs K per estimator; value RMSE vs K (MC vs fixed point),
    one row of panels per (horizon, temperature)."""
    from matplotlib.figure import Figure

    groups = _by_setting(results["rows"])
    fig = Figure(figsize=(15, 4 * len(groups)))
    axes = fig.subplots(len(groups), 3, squeeze=False)
    for row, ((h, temp), rows) in zip(axes, groups.items()):
        ks = [r["group_size"] for r in rows]
        for lab in rows[0]["estimators"]:
            if lab == ORACLE:
                continue
            for ax, metric in zip(row[:2], ("pearson", "grad_cos")):
                m = np.array([r["estimators"][lab][metric]["mean"] for r in rows], float)
                e = np.array([r["estimators"][lab][metric]["ci95"] for r in rows], float)
                ax.errorbar(ks, m, yerr=np.nan_to_num(e), marker="o", capsize=3, label=lab)
        for key, name in (("rmse_mc", "Monte-Carlo means"), ("rmse_fp", "fixed point")):
            m = np.array([r["values"][key]["mean"] for r in rows], float)
            e = np.array([r["values"][key]["ci95"] for r in rows], float)
            row[2].errorbar(ks, m, yerr=np.nan_to_num(e), marker="o", capsize=3, label=name)
        titles = ("correlation with A^pi", "policy-gradient cosine", "value RMSE vs exact V^pi")
        for ax, title in zip(row, titles):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("group size K")
            ax.set_title(f"{results['settings']['env']} (H={h}, T={temp}): {title}", fontsize=9)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
        row[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_outputs(results: dict, out: str | Path, *, command: str = "") -> None:
    out = Path(out)
    (out / "credit.md").write_text(markdown(results, command=command))
    if results["rows"]:
        plot(results, out / "credit.png")
