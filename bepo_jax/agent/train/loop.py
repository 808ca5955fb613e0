"""The training loop: one run (``train``), several seeds as one program (``train_seeds``),
and a finished run loaded back (``load_run``).

Both loops write the same run directory per seed (``rundir``) and resume from it: a run
killed at any point and resumed equals the uninterrupted one (same task draws and keys,
``tests/test_cli_train.py``, ``tests/agent/test_multiseed.py``), and seed i of ``train_seeds``
equals ``train`` with that seed to float32 tolerance.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax

from ..rl.checkpoint import Checkpointer
from ..rl.train_step import TrainState
from . import rundir
from .config import RunConfig
from .multiseed import SeedBatch, stack, unstack
from .setup import DEFAULT_HELD_OUT, Setup


def _with_env(cfg: RunConfig, env):
    """``train(..., env=instance)``: register the instance under its name and run on it."""
    if env is None:
        return cfg
    from ..envs.registry import register_env

    name = getattr(env, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"env={env!r} needs a 'name' attribute (a string): the run directory records it.")
    register_env(name, lambda _cfg, _env=env: _env, overwrite=True)
    return cfg.replace(env=name)


def _setup_for_run(cfg: RunConfig, run_dir: Path, games_dir: Optional[Path] = None) -> Setup:
    """The run's Setup; generated TextWorld games are shared by the runs beside it (or kept in
    ``games_dir``: a game's file name holds everything it is generated from). A pretrained
    policy (``cfg.model``) gets an ``LLMSetup``."""
    cache = games_dir or run_dir.parent / ".textworld_games"
    held_out = rundir.held_out_pools(run_dir)  # a run written before the pools were disjoint keeps its own
    if cfg.pretrained:
        from .llm_setup import LLMSetup

        return LLMSetup(cfg, cache_dir=cache, held_out=held_out)
    return Setup(cfg, cache_dir=cache, held_out=held_out)


def _evaluations(held: dict, train_ev: dict) -> dict:
    return {**{f"eval/{k}": v for k, v in held.items()}, **{f"eval_train/{k}": v for k, v in train_ev.items()}}


def _first_row(evals: dict) -> dict:
    first = evals.get("eval_train/success_rate", evals["eval/success_rate"])
    return {"iteration": 0, **evals, "success_rate": first}


def _timed(m: dict, seconds: float) -> dict:
    m = dict(m)
    m["step_time"] = seconds
    m["env_steps_per_s"] = m["env_steps"] / seconds
    return m


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          on_iteration: Optional[Callable[[int, dict], None]] = None, env=None) -> dict:
    """Run (or resume) a training run under ``out``. Returns the first and last evaluations:
    ``initial`` / ``final`` (held-out tasks), ``initial_train`` / ``final_train`` (training tasks).

    ``env``: a JaxEnv instance to train on (registered under ``env.name``, which becomes
    ``cfg.env``; to resume in another process, register it there too, or name it by an
    import path ``"package.module:factory"`` in ``cfg.env`` instead)."""
    out = Path(out)
    with rundir.RunLock(out):
        return _train(cfg, out, resume=resume, progress=progress, on_iteration=on_iteration, env=env)


def _check_model(cfg: RunConfig) -> None:
    """A pretrained run's checkpoint exists (checked before the run directory is written)."""
    if cfg.pretrained:
        from ..models.hub import resolve

        path = resolve(cfg.model)  # an unfetched registry name raises, naming `bepo-jax models fetch`
        if not path.exists():
            raise FileNotFoundError(f"RunConfig.model={cfg.model!r}: no checkpoint at {path}; give a GGUF file, a "
                                    "Hugging Face checkpoint directory, or a fetched name (bepo-jax models list).")


def _train(cfg: RunConfig, out: Path, *, resume: bool, progress: bool, on_iteration, env) -> dict:
    _check_model(cfg)
    fresh = not (out / "config.json").exists()
    cfg = rundir.prepare(_with_env(cfg, env), out, resume=resume)
    try:
        setup = _setup_for_run(cfg, out)
    except BaseException:
        if fresh:  # nothing of a run that never started stays to block the corrected command
            for name in ("config.json", rundir.HELD_OUT_FILE):
                (out / name).unlink(missing_ok=True)
        raise
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    state = setup.init_state()
    start, rows = 0, []
    if resume and ckpt.steps():
        state, meta, start = ckpt.restore_latest(setup.trainer.abstract_state())
        start = int(meta.get("iteration", start))
        rows = [r for r in rundir.read_metrics(out) if r["iteration"] <= start]
    log = rundir.MetricsLog(out, rows, start)
    evaluate = lambda st, seed: _evaluations(setup.evaluate(st.params, seed=seed),
                                             setup.evaluate(st.params, seed=seed, training=True)
                                             if cfg.eval_train else {})
    try:
        if not log.rows:
            log.append(_first_row(evaluate(state, cfg.seed)))
        with rundir.progress_bar(progress) as bar:
            task = bar.add_task(f"{cfg.env}/{cfg.estimator}", total=cfg.iterations, completed=start, success=0.0,
                                step_time=0.0)
            for it in range(start + 1, cfg.iterations + 1):
                t0 = time.perf_counter()
                state, m = setup.iterate(state, it)
                row = {"iteration": it, **_timed(m, time.perf_counter() - t0)}
                if it % cfg.eval_every == 0 or it == cfg.iterations:
                    row.update(evaluate(state, cfg.seed + it))
                log.append(row)
                if it % cfg.checkpoint_every == 0 or it == cfg.iterations:
                    ckpt.save(it, state, {"iteration": it, "config": cfg.to_dict()})
                bar.update(task, completed=it, success=row["success_rate"], step_time=row["step_time"])
                if on_iteration is not None:
                    on_iteration(it, row)
    finally:
        log.close(cfg)
        ckpt.close()
    return rundir.finish(cfg, out, log.rows)


def train_seeds(cfg: RunConfig, seeds: Sequence[int], outs: Sequence[str | Path], *, resume: bool = False,
                progress: bool = True, on_iteration: Optional[Callable[[int, list[dict]], None]] = None,
                mesh=None, env=None, runs_per_step="auto") -> list[dict]:
    """``train(cfg.replace(seed=s), outs[i])`` for every seed, as ONE compiled program per
    iteration (``SeedBatch``: rollouts and updates over a run axis — looped inside the
    program on CPU, vmapped elsewhere, ``runs_per_step`` — and sharded over ``mesh``'s
    "runs" axis when given). Each ``outs[i]`` is an ordinary run directory
    (``bepo-jax eval`` and ``train(..., resume=True)`` read it). Resuming restores every
    seed from the newest checkpoint iteration that all of them have. Returns one
    ``train``-style result per seed, each with its metrics ``rows``.

    With several JAX processes (``rl.multihost``) every process calls this with the same
    arguments and a mesh whose "runs" axis spans all devices: run i belongs to the process
    whose devices hold it (``multihost.run_owners``), and only that process locks, writes
    and checkpoints ``outs[i]``; the metrics of every run reach every process (the results
    returned are the same everywhere). A process that cannot use its directories (another
    config, another writer) stops all of them with its reason."""
    seeds = [int(s) for s in seeds]
    outs = [Path(o) for o in outs]
    if len(outs) != len(seeds):
        raise ValueError(f"train_seeds: {len(seeds)} seeds but {len(outs)} run directories; give one per seed.")
    import contextlib

    from ..rl.multihost import run_owners

    owners = run_owners(mesh, len(seeds))
    mine = [i for i, p in enumerate(owners) if p == jax.process_index()]
    with contextlib.ExitStack() as locks:
        _on_every_process(lambda: [locks.enter_context(rundir.RunLock(outs[i])) for i in mine])
        return _train_seeds(cfg, seeds, outs, mine, owners, resume=resume, progress=progress,
                            on_iteration=on_iteration, mesh=mesh, env=env, runs_per_step=runs_per_step)


def _on_every_process(action: Callable[[], Any]) -> Any:
    """``action()`` on this process's run directories; when it raises ``ValueError`` on any process,
    every process raises (its own error where it is this one), so none is left in a collective."""
    from ..rl.multihost import agree

    try:
        out, own = action(), None
    except ValueError as e:
        out, own = None, e
    ok = agree(own is None)[:, 0]
    if own is not None:
        raise own
    if not ok.all():
        bad = [p for p, x in enumerate(ok) if not x]
        raise ValueError(f"process(es) {bad} refused their run directories (their logs say why); nothing was "
                         "trained. Fix that and relaunch every process.")
    return out


def _train_seeds(cfg, seeds, outs, mine, owners, *, resume, progress, on_iteration, mesh, env,
                 runs_per_step) -> list[dict]:
    import numpy as np

    from ..rl.multihost import agree, gather_owned, gather_owned_json
    from .multiseed import host_copy

    multi = jax.process_count() > 1

    base = _with_env(cfg, env)
    # on resume, prepare returns the stored config (only iterations may differ from base)
    prepared = _on_every_process(lambda: [rundir.prepare(base.replace(seed=seeds[i]), outs[i], resume=resume)
                                          for i in mine])
    cfg = (prepared[0] if prepared else base).replace(seed=base.seed)
    cfgs = [cfg.replace(seed=s) for s in seeds]
    pools = {rundir.held_out_pools(outs[i]) for i in mine}
    if len(pools) > 1:
        raise ValueError(f"train_seeds: the run directories {[str(outs[i]) for i in mine]} mix held-out pools "
                         f"({', '.join(sorted(pools))}: runs written before and after the pools were made disjoint); "
                         "resume them apart, or start the older ones again in new directories.")
    runs = SeedBatch(cfg, seeds, mesh=mesh, runs_per_step=runs_per_step, held_out=pools.pop() if pools else DEFAULT_HELD_OUT)
    ckpts = {i: Checkpointer(outs[i] / "checkpoints", max_to_keep=cfg.keep_checkpoints,
                             process=jax.process_index()) for i in mine}
    logs, rows = {}, [[] for _ in seeds]
    try:
        states, start = runs.init_states(), 0
        if resume:
            # the newest iteration every run has a checkpoint of, over all processes
            steps = set.intersection(*[set(c.steps()) for c in ckpts.values()]) if ckpts else None
            have = [steps is None or t in steps for t in range(cfg.iterations + 1)]
            start = max((t for t, ok in enumerate(agree(have).all(axis=0)) if ok and t), default=0)
        if start and not multi:
            restored = [ckpts[i].restore(runs.setups[i].trainer.abstract_state(), start)[0] for i in mine]
            states = runs.place(stack(restored))
        elif start:  # each process restores its own runs; every process then places all of them
            fresh = host_copy(states)
            restored = [jax.tree_util.tree_map(np.asarray, ckpts[i].restore(unstack(fresh, i), start)[0])
                        if i in ckpts else unstack(fresh, i) for i in range(len(seeds))]
            states = runs.place(stack(gather_owned(restored, owners)))
        for i in mine:
            rows[i] = [r for r in rundir.read_metrics(outs[i]) if r["iteration"] <= start] if start else []
        if start and multi:
            rows = gather_owned_json(rows, owners)
        for i in mine:
            logs[i] = rundir.MetricsLog(outs[i], rows[i], start)

        def evaluate(states, it):
            held = runs.evaluate_all(states, [s + it for s in seeds])
            tr = runs.evaluate_all(states, [s + it for s in seeds], training=True)
            return [_evaluations(h, t) for h, t in zip(held, tr)]

        def append(new_rows):
            for i, row in enumerate(new_rows):
                rows[i].append(row)
                if i in logs:
                    logs[i].append(row)

        if not start:
            append([_first_row(ev) for ev in evaluate(states, 0)])
        with rundir.progress_bar(progress and jax.process_index() == 0) as bar:
            task = bar.add_task(f"{cfg.env}/{cfg.estimator} x{len(seeds)} seeds", total=cfg.iterations,
                                completed=start, success=0.0, step_time=0.0)
            for it in range(start + 1, cfg.iterations + 1):
                t0 = time.perf_counter()
                states, ms = runs.iterate(states, it)
                seconds = time.perf_counter() - t0
                new = [{"iteration": it, **_timed(m, seconds)} for m in ms]
                if it % cfg.eval_every == 0 or it == cfg.iterations:
                    for row, ev in zip(new, evaluate(states, it)):
                        row.update(ev)
                append(new)
                if it % cfg.checkpoint_every == 0 or it == cfg.iterations:
                    # across processes: every run's state to every host (a collective), each owner saves its own
                    host = host_copy(states) if multi else None
                    for i, c in ckpts.items():
                        run = unstack(states, i) if not multi else unstack(host, i)
                        c.save(it, run, {"iteration": it, "config": cfgs[i].to_dict()})
                bar.update(task, completed=it, success=sum(r["success_rate"] for r in new) / len(new),
                           step_time=seconds)
                if on_iteration is not None:
                    on_iteration(it, new)
    finally:
        for i, log in logs.items():
            log.close(cfgs[i])
        for c in ckpts.values():
            c.close()
    results = []
    for i, (ci, o) in enumerate(zip(cfgs, outs)):
        res = rundir.finish(ci, o, rows[i], write=i in logs)
        results.append({**res, "rows": rows[i]})
    return results


def load_run(path: str | Path, *, games_dir: Optional[str | Path] = None) -> tuple[Setup, TrainState, int]:
    """A run directory (or its ``checkpoints/``) -> (setup, restored state, iteration).
    ``games_dir``: where TextWorld games are found or generated (default: beside the run)."""
    import json

    path = Path(path)
    run = path.parent if path.name == "checkpoints" else path
    cfg_path = run / "config.json"
    if not cfg_path.exists():
        raise ValueError(f"{path} is not a run directory: no config.json in {run} (pass the --out of a train run).")
    cfg = RunConfig.from_stored(json.loads(cfg_path.read_text()))
    setup = _setup_for_run(cfg, run, Path(games_dir) if games_dir else None)
    return (setup, *restore_latest(setup, run))


def restore_latest(setup: Setup, run: str | Path) -> tuple[TrainState, int]:
    """The newest checkpoint of run directory ``run`` restored into ``setup``'s state structure, and its
    iteration (``setup`` may be another run's of the same policy and update: an arm of the same seed)."""
    ckpt = Checkpointer(Path(run) / "checkpoints", max_to_keep=setup.cfg.keep_checkpoints)
    try:
        state, meta, step = ckpt.restore_latest(setup.trainer.abstract_state())
    finally:
        ckpt.close()
    return state, int(meta.get("iteration", step))
