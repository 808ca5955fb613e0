"""The main job: train a token policy with an estimator's credit in an environment.

    for it in 1..iterations:
        tasks  <- B tasks from the training pool (K trajectories each, identical resets)
        rollout -> StepBatch (+ tokens, masks, old log-probs)
        A      <- estimator(StepBatch)              (per step, broadcast to response tokens)
        state  <- Trainer update (PPO clip, AdamW)

For JAX environments (Sokoban, Jumanji) the task draw, the rollout, the advantages and
the update are ONE jitted program per iteration (PureJaxRL style); for host
environments (TextWorld) the host loop rolls out and one jitted program computes the
advantages and the update. A run directory holds ``config.json``, ``metrics.jsonl``
(one line per iteration; held-out evaluations as ``eval/...`` keys), TensorBoard
events (``tb/``), ``curve.png`` and orbax checkpoints (``checkpoints/``); ``resume=True``
continues from the newest readable checkpoint with the same task draws and keys as an
uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ._config import check_choice, check_int, check_range, with_dict_methods
from .envs.text import VOCAB
from .estimators.registry import ESTIMATORS, get_estimator, make_config
from .models import DecoderLM, TransformerConfig
from .rl.checkpoint import Checkpointer
from .rl.loss import PPOLossConfig
from .rl.train_step import TrainConfig, Trainer, TrainState, UpdateBatch
from .rollout import Rollout, RolloutConfig, make_rollout, prompt_length
from .tokens import to_token_advantages

ENVS = ("sokoban", "maze", "textworld")
EVAL_SEED_OFFSET = 1_000_003


@with_dict_methods
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs (written to ``config.json``).

    env ("sokoban" | "maze" | "textworld"), estimator (a registry name) and
    estimator_config (field overrides, e.g. {"lam": 0.5}); iterations, groups B per
    iteration, group_size K; rollout: prompt_history h (observation/action pairs in the prompt), temperature, constrained decoding,
    invalid_penalty, max_steps (0 = the environment's default); policy: layers, width,
    heads; update: learning_rate, ppo_epochs, num_minibatches, entropy_coef; tasks:
    task_pool (the training tasks, 0 = the environment's default: 32 Sokoban levels / 32
    mazes / 8 TextWorld games), eval_tasks (held-out tasks, and as many training tasks,
    evaluated every eval_every iterations);
    checkpoint_every, keep_checkpoints; seed. Environment knobs: boxes (Sokoban max
    boxes), rooms/objects/quest_length (TextWorld)."""

    env: str = "sokoban"
    estimator: str = "gated_bepo"
    estimator_config: dict = dataclasses.field(default_factory=dict)
    iterations: int = 60
    groups: int = 8
    group_size: int = 8
    prompt_history: int = 2
    temperature: float = 1.0
    constrained: bool = True
    invalid_penalty: float = -0.1
    max_steps: int = 0
    layers: int = 1
    width: int = 64
    heads: int = 4
    learning_rate: float = 3e-3
    ppo_epochs: int = 1
    num_minibatches: int = 1
    entropy_coef: float = 0.0
    task_pool: int = 0
    eval_tasks: int = 32
    eval_every: int = 20
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0
    boxes: int = 2
    rooms: int = 2
    objects: int = 3
    quest_length: int = 1

    @classmethod
    def from_stored(cls, d: dict) -> "RunConfig":
        """A RunConfig from a run's config.json, including runs written before
        ``history`` was renamed ``prompt_history``."""
        d = dict(d)
        if "history" in d and "prompt_history" not in d:
            d["prompt_history"] = d.pop("history")
        return cls.from_dict(d)

    def __post_init__(self):
        n = "RunConfig"
        check_choice(n, "env", self.env, ENVS)
        check_choice(n, "estimator", self.estimator, ESTIMATORS)
        if not isinstance(self.estimator_config, dict):
            raise ValueError("RunConfig.estimator_config must be a dict of the estimator's config fields.")
        make_config(self.estimator, **self.estimator_config)  # unknown fields raise, listing the valid ones
        for f in ("iterations", "groups", "group_size", "layers", "width", "heads", "ppo_epochs", "num_minibatches",
                  "eval_tasks", "eval_every", "checkpoint_every", "keep_checkpoints", "boxes", "rooms", "objects",
                  "quest_length"):
            check_int(n, f, getattr(self, f), lo=1)
        for f in ("prompt_history", "max_steps", "task_pool", "seed"):
            check_int(n, f, getattr(self, f), lo=0)
        check_range(n, "temperature", self.temperature, lo=0.0, lo_open=True)
        check_range(n, "invalid_penalty", self.invalid_penalty, hi=0.0)
        check_range(n, "learning_rate", self.learning_rate, lo=0.0, lo_open=True)
        check_range(n, "entropy_coef", self.entropy_coef, lo=0.0)
        if self.width % self.heads:
            raise ValueError(f"RunConfig.width={self.width} must be a multiple of heads={self.heads}.")


# ------------------------------------------------------------------------------ the pieces


class Setup:
    """The environment, policy, trainer and rollout functions of a run config."""

    def __init__(self, cfg: RunConfig, *, cache_dir: Optional[Path] = None):
        self.cfg = cfg
        self.host = cfg.env == "textworld"
        self.rollout_cfg = RolloutConfig(group_size=cfg.group_size, prompt_history=cfg.prompt_history, temperature=cfg.temperature,
                                         constrained=cfg.constrained, invalid_penalty=cfg.invalid_penalty,
                                         max_response=8 if not self.host else 25)
        if not self.host:
            from .envs import jax_env

            self.env = jax_env(cfg.env, max_steps=cfg.max_steps, boxes=cfg.boxes)
        if self.host:
            from .envs.textworld_env import TextWorldEnv, generate_games
            from .host_rollout import make_host_rollout

            games_dir = Path(cache_dir or Path.home() / ".cache" / "bepo_jax" / "textworld")
            pool = cfg.task_pool or 8
            kw = dict(rooms=cfg.rooms, objects=cfg.objects, quest_length=cfg.quest_length)
            self.train_tasks = [str(p) for p in generate_games(pool, games_dir, seed=cfg.seed * 7919, **kw)]
            self.eval_pool = [str(p) for p in generate_games(
                min(cfg.eval_tasks, 8), games_dir, seed=cfg.seed * 7919 + EVAL_SEED_OFFSET, **kw)]
            obs_len, word, cmds, task_len, self.max_steps = 160, 24, 12, 96, cfg.max_steps or 8
            P = prompt_length(obs_len, cfg.prompt_history, word, task_len)
            make = lambda: TextWorldEnv(obs_chars=obs_len, objective_chars=task_len, max_commands=cmds,
                                        command_chars=word)
            host_args = dict(make_env=make, max_steps=self.max_steps, obs_len=obs_len, word_width=word,
                                   max_commands=cmds, task_len=task_len)
        else:
            word = max(len(w) for w in self.env.action_words)
            P = prompt_length(self.env.obs_len, cfg.prompt_history, word)
            self.max_steps = self.env.max_steps
            pool = cfg.task_pool or 32
            self.train_tasks = self.env.sample_tasks(pool, cfg.seed)
            self.eval_pool = self.env.sample_tasks(cfg.eval_tasks, cfg.seed + EVAL_SEED_OFFSET)
        self.pool_size = pool
        self.model = DecoderLM(TransformerConfig(vocab=VOCAB, layers=cfg.layers, width=cfg.width, heads=cfg.heads,
                                                 context=P + self.rollout_cfg.max_response), rngs=nnx.Rngs(cfg.seed))
        self.trainer = Trainer(self.model, TrainConfig(
            learning_rate=cfg.learning_rate, total_steps=cfg.iterations, ppo_epochs=cfg.ppo_epochs,
            num_minibatches=cfg.num_minibatches, loss=PPOLossConfig(entropy_coef=cfg.entropy_coef), seed=cfg.seed))
        self.estimator = get_estimator(cfg.estimator)
        self.est_cfg = make_config(cfg.estimator, **cfg.estimator_config)
        if self.host:
            self.rollout = make_host_rollout(self.model, config=self.rollout_cfg, **host_args)
        else:
            self.rollout = make_rollout(self.model, self.env, self.rollout_cfg)
        self._iteration = None  # jitted on first use
        self._update = None
        self._eval = None

    # -- one iteration ------------------------------------------------------------------
    def advantages(self, batch):
        """The estimator's output on a StepBatch (per group: any number of groups)."""
        return self.estimator.kernel(batch, self.est_cfg)

    def _learn(self, state: TrainState, ro: Rollout):
        """Advantages of the rollout, the update, and the iteration's metrics (traceable)."""
        return self.learn_from(state, ro, self.advantages(ro.batch))

    def learn_from(self, state: TrainState, ro: Rollout, out):
        """The update and the iteration's metrics given the estimator's output (traceable)."""
        adv = to_token_advantages(out.advantage, ro.response_mask)
        L = ro.tokens.shape[-1]
        flat = lambda x: x.reshape(-1, L)
        state, m = self.trainer.update_fn(state, UpdateBatch(flat(ro.tokens), flat(ro.mask), flat(ro.response_mask),
                                                             flat(ro.old_logp), flat(adv)))
        valid = ro.batch.mask
        m = dict(m)
        m["success_rate"] = jnp.mean(ro.success.astype(jnp.float32))
        m["return"] = jnp.mean(jnp.sum(ro.batch.reward, axis=-1))
        m["invalid_rate"] = jnp.sum((ro.actions < 0) & valid) / jnp.maximum(jnp.sum(valid), 1)
        m["episode_length"] = jnp.mean(jnp.sum(valid, axis=-1).astype(jnp.float32))
        m["env_steps"] = jnp.sum(valid)
        m["step_advantage_std"] = jnp.std(jnp.where(valid, out.advantage, 0.0))
        m["step_advantage_abs_max"] = jnp.max(jnp.abs(jnp.where(valid, out.advantage, 0.0)))
        if not self.host:  # the sampled actions: a collapsing policy shows here, not in the token entropy
            words = self.env.action_words
            counts = jnp.sum((ro.actions[..., None] == jnp.arange(len(words))) & valid[..., None],
                             axis=tuple(range(valid.ndim))).astype(jnp.float32)
            share = counts / jnp.maximum(jnp.sum(counts), 1.0)
            m["actions/entropy"] = -jnp.sum(jnp.where(share > 0, share * jnp.log(jnp.where(share > 0, share, 1.0)), 0.0))
            for a, w in enumerate(words):
                m[f"actions/share_{w}"] = share[a]
        diag = getattr(out, "diagnostics", None)
        if diag is not None:
            m["graph/states"] = jnp.mean(diag.num_states.astype(jnp.float32))
            m["graph/gated_share"] = jnp.mean(diag.gated_share)
            m["graph/iterations_mean"] = jnp.mean(diag.iterations.astype(jnp.float32))
            m["graph/iterations_max"] = jnp.max(diag.iterations).astype(jnp.float32)
            m["graph/converged_share"] = jnp.mean(diag.converged.astype(jnp.float32))
            m["graph/overflow_share"] = jnp.mean(diag.overflow.astype(jnp.float32))
        invalid = diag.invalid if diag is not None else getattr(out, "invalid", None)
        if invalid is not None:
            m["invalid_groups"] = jnp.sum(invalid != 0).astype(jnp.float32)
        return state, m

    def _draw(self, key):
        idx = jax.random.choice(key, self.pool_size, (self.cfg.groups,), replace=self.pool_size < self.cfg.groups)
        return idx

    def iteration_key(self, it: int):
        """The PRNG key of iteration ``it`` (task draw and rollout), from the run's seed."""
        return jax.random.fold_in(jax.random.PRNGKey(self.cfg.seed), it)

    def rollout_fn(self, state: TrainState, tasks, key) -> Rollout:
        """The iteration's rollout (JAX environments): draw B of ``tasks`` with ``key``'s
        first half, roll them out with its second."""
        k_task, k_roll = jax.random.split(key)
        chosen = jax.tree_util.tree_map(lambda x: x[self._draw(k_task)], tasks)
        return self.rollout(state.params, chosen, k_roll)

    def iteration_fn(self, state: TrainState, tasks, key):
        """One fused iteration as a pure function (JAX environments): draw B of ``tasks``,
        roll out, compute advantages, update. Traceable (``multiseed`` vmaps its parts)."""
        return self._learn(state, self.rollout_fn(state, tasks, key))

    def iterate(self, state: TrainState, it: int):
        """One iteration: (state, metrics as floats)."""
        key = self.iteration_key(it)
        if not self.host:
            if self._iteration is None:
                self._iteration = jax.jit(self.iteration_fn, donate_argnums=(0,))
                self._tasks = jax.tree_util.tree_map(jnp.asarray, self.train_tasks)
            state, m = self._iteration(state, self._tasks, key)
        else:
            k_task, k_roll = jax.random.split(key)
            idx = np.asarray(self._draw(k_task))
            ro = self.rollout(state.params, [self.train_tasks[i] for i in idx], k_roll)
            if self._update is None:
                self._update = jax.jit(self._learn, donate_argnums=(0,))
            state, m = self._update(state, ro)
        return state, {k: float(v) for k, v in jax.device_get(m).items()}

    def evaluate(self, params, *, n_tasks: Optional[int] = None, seed: int = 0, training: bool = False) -> dict:
        """Success rate of the policy (K samples per task at the run's temperature) on
        held-out tasks, or on the first ``eval_tasks`` training tasks (``training``)."""
        key = jax.random.PRNGKey(seed)
        n = n_tasks or self.cfg.eval_tasks
        if self.host:
            pool = self.train_tasks if training else self.eval_pool
            ro = self.rollout(params, pool[:n], key)
        else:
            if self._eval is None:
                self._eval = jax.jit(self.rollout)
            if training:
                pool = jax.tree_util.tree_map(lambda x: x[: min(n, self.pool_size)], self.train_tasks)
            elif n != self.cfg.eval_tasks:
                pool = self.env.sample_tasks(n, self.cfg.seed + EVAL_SEED_OFFSET)
            else:
                pool = self.eval_pool
            ro = self._eval(params, jax.tree_util.tree_map(jnp.asarray, pool), key)
        s = np.asarray(ro.success, np.float64)
        per_task = s.mean(axis=1)
        ci = mean_ci(per_task)[1]
        return {"success_rate": float(s.mean()), "tasks": int(s.shape[0]), "ci95": 0.0 if math.isnan(ci) else ci,
                "return": float(np.asarray(ro.batch.reward).sum(-1).mean()),
                "per_task": [float(x) for x in per_task]}


def mean_ci(values) -> tuple[float, float]:
    """Mean and the 95% Student-t half-width (nan for fewer than two values)."""
    from scipy import stats

    x = np.asarray(values, np.float64)
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def trailing_mean(x, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    x = np.asarray(x, np.float64)
    return np.array([x[max(0, i - window + 1): i + 1].mean() for i in range(len(x))])


def paired_change(before: dict, after: dict) -> tuple[float, float]:
    """Mean change of per-task success between two evaluations of the same tasks, with
    its 95% t half-width (the paired test: task difficulty cancels)."""
    a, b = np.asarray(before["per_task"]), np.asarray(after["per_task"])
    return mean_ci(b - a)


# ------------------------------------------------------------------------------ the run


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by a crash: everything before it is intact
    return rows


def draw_curve(rows: list[dict], ax) -> None:
    """Training success rate (raw and trailing mean) and the evaluations (training tasks
    and held-out, with 95% CIs) vs iteration, on a matplotlib Axes."""
    it = np.array([r["iteration"] for r in rows])
    if len(it):
        sr = np.array([r["success_rate"] for r in rows])
        ax.plot(it, sr, color="0.75", lw=1, label="train (per iteration)")
        w = max(1, len(sr) // 10)
        ax.plot(it, trailing_mean(sr, w), color="C0", label=f"train ({w}-iteration mean)")
        for prefix, color, label in (("eval_train/", "C2", "training tasks (eval)"), ("eval/", "C3", "held-out")):
            ev = [(r["iteration"], r[prefix + "success_rate"], r.get(prefix + "ci95", 0.0))
                  for r in rows if prefix + "success_rate" in r]
            if ev:
                e = np.array(ev)
                ax.errorbar(e[:, 0], e[:, 1], yerr=e[:, 2], fmt="o-", color=color, capsize=3, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left", fontsize=8)


def plot_curve(rows: list[dict], path: Path, *, title: str = "") -> None:
    """``draw_curve`` into a PNG file."""
    from matplotlib.figure import Figure  # no pyplot: no backend switch, works in notebooks and headless

    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    draw_curve(rows, ax)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          on_iteration: Optional[Callable[[int, dict], None]] = None) -> dict:
    """Run (or resume) a training run under ``out``. Returns the first and last evaluations:
    ``initial`` / ``final`` (held-out tasks), ``initial_train`` / ``final_train`` (training tasks)."""
    out = Path(out)
    cfg_path = out / "config.json"
    if cfg_path.exists() and not resume:
        raise ValueError(f"{out} already holds a run (config.json); pass resume=True (--resume) to continue it, "
                         "or choose another --out.")
    if resume and cfg_path.exists():
        stored = RunConfig.from_stored(json.loads(cfg_path.read_text()))
        if stored.replace(iterations=cfg.iterations) != cfg:
            diff = sorted(k for k, v in cfg.to_dict().items() if stored.to_dict()[k] != v and k != "iterations")
            raise ValueError(f"resume: the config differs from {cfg_path} in {diff}; resume with the stored config "
                             "(only iterations may change).")
        cfg = stored.replace(iterations=cfg.iterations)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(cfg_path, json.dumps(cfg.to_dict(), indent=2))

    setup = _setup_for_run(cfg, out)
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    state = setup.trainer.init_state()
    start = 0
    rows = []
    if resume and ckpt.steps():
        state, meta, start = ckpt.restore_latest(setup.trainer.abstract_state())
        start = int(meta.get("iteration", start))
        rows = [r for r in read_metrics(out) if r["iteration"] <= start]
    _atomic_write(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))

    from tensorboardX import SummaryWriter

    tb = SummaryWriter(str(out / "tb"), purge_step=start + 1 if start else None)
    if not rows:
        row = {"iteration": 0, **_evaluations(setup, state, cfg.seed)}
        row["success_rate"] = row["eval_train/success_rate"]
        rows.append(row)
        _append(out, row, tb)
    bar = _progress(progress)
    try:
        with bar:
            task = bar.add_task(f"{cfg.env}/{cfg.estimator}", total=cfg.iterations, completed=start, success=0.0,
                                step_time=0.0)
            for it in range(start + 1, cfg.iterations + 1):
                t0 = time.perf_counter()
                state, m = setup.iterate(state, it)
                m["step_time"] = time.perf_counter() - t0
                m["env_steps_per_s"] = m["env_steps"] / m["step_time"]
                row = {"iteration": it, **m}
                if it % cfg.eval_every == 0 or it == cfg.iterations:
                    row.update(_evaluations(setup, state, cfg.seed + it))
                rows.append(row)
                _append(out, row, tb)
                if it % cfg.checkpoint_every == 0 or it == cfg.iterations:
                    ckpt.save(it, state, {"iteration": it, "config": cfg.to_dict()})
                bar.update(task, completed=it, success=m["success_rate"], step_time=m["step_time"])
                if on_iteration is not None:
                    on_iteration(it, row)
    finally:
        tb.close()
        ckpt.close()
        if rows:
            plot_curve(rows, out / "curve.png", title=f"{cfg.env} / {cfg.estimator} (seed {cfg.seed})")
    pick = lambda row, p: {k[len(p):]: v for k, v in row.items() if k.startswith(p)}
    res = {"initial": pick(rows[0], "eval/"), "final": pick(rows[-1], "eval/"),
           "initial_train": pick(rows[0], "eval_train/"), "final_train": pick(rows[-1], "eval_train/"),
           "iterations": cfg.iterations, "out": str(out)}
    _atomic_write(out / "summary.json", json.dumps(run_summary(cfg, rows, res), indent=2))
    return res


def run_summary(cfg: RunConfig, rows: list[dict], res: dict, window: int = 10) -> dict:
    """What a finished run reports (``summary.json``): success before/after on held-out and
    training tasks with the paired change and its 95% t-interval over tasks, the trailing
    training success at the start and the end, and the time per iteration."""
    out = {"config": cfg.to_dict(), "iterations": cfg.iterations, "window": window}
    for name, i, f in (("held_out", res["initial"], res["final"]), ("train", res["initial_train"], res["final_train"])):
        d, h = paired_change(i, f)
        out[name] = {"tasks": f["tasks"], "before": i["success_rate"], "after": f["success_rate"],
                     "paired_change": d, "paired_ci95": h, "interval_includes_zero": bool(abs(d) <= h)}
    it_rows = [r for r in rows if r["iteration"] > 0 and "success_rate" in r and "step_time" in r]
    if it_rows:
        trail = trailing_mean([r["success_rate"] for r in it_rows], window)
        times = sorted(r["step_time"] for r in it_rows[1:] or it_rows)  # the first iteration compiles
        out.update(trailing_success_first=float(trail[min(window, len(trail)) - 1]),
                   trailing_success_last=float(trail[-1]), seconds_per_iteration=float(times[len(times) // 2]))
    return out


def _evaluations(setup: Setup, state: TrainState, seed: int) -> dict:
    """Held-out (``eval/...``) and training-task (``eval_train/...``) success rates."""
    held = setup.evaluate(state.params, seed=seed)
    train_ev = setup.evaluate(state.params, seed=seed, training=True)
    return {**{f"eval/{k}": v for k, v in held.items()}, **{f"eval_train/{k}": v for k, v in train_ev.items()}}


def _append(out: Path, row: dict, tb) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    for k, v in row.items():
        if k != "iteration" and not isinstance(v, list):
            tb.add_scalar(k, v, row["iteration"])
    tb.flush()


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("success {task.fields[success]:.2f}"), TextColumn("{task.fields[step_time]:.2f} s/it"),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled)


def _setup_for_run(cfg: RunConfig, run_dir: Path) -> Setup:
    """The run's Setup; generated TextWorld games are shared by the runs beside it."""
    return Setup(cfg, cache_dir=run_dir.parent / ".textworld_games")


def load_run(path: str | Path) -> tuple[Setup, TrainState, int]:
    """A run directory (or its ``checkpoints/``) -> (setup, restored state, iteration)."""
    path = Path(path)
    run = path.parent if path.name == "checkpoints" else path
    cfg_path = run / "config.json"
    if not cfg_path.exists():
        raise ValueError(f"{path} is not a run directory: no config.json in {run} (pass the --out of a train run).")
    cfg = RunConfig.from_stored(json.loads(cfg_path.read_text()))
    setup = _setup_for_run(cfg, run)
    ckpt = Checkpointer(run / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    try:
        state, meta, step = ckpt.restore_latest(setup.trainer.abstract_state())
    finally:
        ckpt.close()
    return setup, state, int(meta.get("iteration", step))
