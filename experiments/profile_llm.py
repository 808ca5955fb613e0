"""What an LLM iteration costs on this machine, and what the untrained model does with each prompt.

    python -m experiments.profile_llm                      # both parts
    python -m experiments.profile_llm --part prompts       # only the prompt probe
    python -m experiments.profile_llm --part iteration     # only the iteration profile
    python -m experiments.profile_llm --part compile       # only the update's compile, two ways

Part ``prompts``: SmolLM2-135M-Instruct, untrained, answers the first turn of 4 TextWorld games
(quest length 1) 8 times each at temperature 0.7 under each prompt variant (reply format;
the worked example turn on or off; admissible commands one per line or comma-separated); the
share of replies that name no admissible command, and the share that win at once.

Part ``iteration``: the ``llm_textworld`` recipe's iteration (2 games x 4 episodes x at most 4
turns) with each choice of trained parameters (top 2 blocks, the update starting from the frozen
blocks' output the rollout recorded, or running them again; LoRA rank 8 on q and v of all 30
blocks; every parameter) and with the reply cut to 12 tokens: seconds of the first iteration
(compiles included) and the second, split into decoding the replies, stepping the games and the
rest (advantages and the update), and the peak resident memory of the process so far.

Part ``compile``: the update program of one recipe iteration (advantages, PPO, metrics), compiled
with the parameters that do not train (and the KL reference, when on) passed as arguments of the
jitted program (what ``Setup.iterate`` does) and, for comparison, closed over by it, which makes
them constants of the compiled program: seconds to lower and compile, for the recipe (top 2
blocks) and for LoRA r8 on q and v of all 30 blocks.

Results: ``experiments/results/llm_profile.json`` and ``.md``.
"""

from __future__ import annotations

import dataclasses
import resource
import time

import jax
import numpy as np

from bepo_jax.agent.rollouts import chat as chat_rollout
from bepo_jax.agent.train.recipes import recipe

from .common import RESULTS, command, machine, parser, write_json, write_lines

NAME = "profile_llm"
VARIANTS = {  # name -> RunConfig overrides of the recipe (and "_reuse_frozen", the LLMSetup flag)
    "top 2 blocks (recipe)": {},
    "top 2 blocks, the frozen 28 run again in the update": {"_reuse_frozen": False},
    "LoRA r8 q,v (30 blocks)": {"train_layers": 0, "lora_rank": 8, "grad_accum": 4},
    "every parameter": {"train_layers": 0, "grad_accum": 4},
    "top 2 blocks, replies <= 12 tokens": {"max_reply": 12},
}


def _setup(cfg, reuse_frozen: bool = True):
    from bepo_jax.agent.train.llm_setup import LLMSetup

    return LLMSetup(cfg, cache_dir=RESULTS.parent.parent / "runs" / ".textworld_games", reuse_frozen=reuse_frozen)


def probe_prompts(games: int = 4, samples: int = 8) -> list[dict]:
    base = recipe("llm_textworld").replace(task_pool=games, groups=games, group_size=samples, max_steps=1)
    setup = _setup(base)
    comma = lambda obs, cmds: f"Observation: {obs.strip()}\nAdmissible commands: {', '.join(cmds)}\nYour command:"
    lined = chat_rollout.user_message
    rows = []
    for fmt in ("bare", "tag"):
        for example in (True, False):
            for listing, user in (("one per line", lined), ("comma-separated", comma)):
                chat_rollout.user_message = user
                try:
                    cfg = dataclasses.replace(setup.rollout_cfg, action_format=fmt, example=example)
                    ro = chat_rollout.ChatRollout(setup.pretrained, setup.trainer.graphdef, setup.trainer.rest,
                                                  setup.env.chat_env, cfg, max_steps=1)
                    out = ro(setup.init_state().params, setup.train_tasks[:games], jax.random.PRNGKey(0))
                finally:
                    chat_rollout.user_message = lined
                act = np.asarray(out.actions)[..., 0]
                rows.append({"format": fmt, "example": example, "commands": listing, "replies": int(act.size),
                             "invalid": float((act < 0).mean()), "won": float(np.asarray(out.success).mean())})
                print(rows[-1], flush=True)
    return rows


def profile_iterations() -> list[dict]:
    rows = []
    for name, over in VARIANTS.items():
        over = dict(over)
        reuse = over.pop("_reuse_frozen", True)
        setup = _setup(recipe("llm_textworld").replace(**over), reuse)
        state = setup.init_state()
        its = []
        for it in (1, 2):
            t0 = time.perf_counter()
            state, m = setup.iterate(state, it)
            its.append({"seconds": time.perf_counter() - t0, "decode_s": m["rollout/decode_s"],
                        "env_s": m["rollout/env_s"], "update_s": m["update_s"], "turns": m["env_steps"]})
        rows.append({"variant": name, "overrides": over, "reuse_frozen": reuse, "first": its[0], "second": its[1],
                     "trained_parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
                     "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20})
        print(rows[-1], flush=True)
        del setup, state
    return rows


def profile_compile() -> list[dict]:
    rows = []
    for name in ("top 2 blocks (recipe)", "LoRA r8 q,v (30 blocks)"):
        setup = _setup(recipe("llm_textworld").replace(**VARIANTS[name]))
        state = setup.init_state()
        ro = setup.rollout(state.params, setup.train_tasks[: setup.cfg.groups], jax.random.PRNGKey(0))
        frozen = setup.frozen_inputs()
        ways = {"as arguments": lambda: jax.jit(setup._learn).lower(state, ro, frozen),
                "closed over (constants)": lambda: jax.jit(lambda s, r: setup._learn(s, r, None)).lower(state, ro)}
        for way, lower in ways.items():
            t0 = time.perf_counter()
            lowered = lower()
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
            rows.append({"variant": name, "frozen": way, "lower_s": t1 - t0, "compile_s": t2 - t1,
                         "hlo_mib": len(lowered.as_text()) / 2**20})
            print(rows[-1], flush=True)
        del setup, state, ro
    return rows


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--part", choices=("both", "prompts", "iteration", "compile"), default="both")
    args = p.parse_args(argv)
    path = RESULTS / "llm_profile.json"
    import json

    res = json.loads(path.read_text()) if path.exists() else {}
    if args.part in ("both", "prompts"):
        res["prompts"] = probe_prompts()
    if args.part in ("both", "iteration"):
        res["iteration"] = profile_iterations()
    if args.part == "compile":  # its own command and machine: the other parts may come from another run
        res["compile"] = profile_compile()
        res.update(compile_command=command(NAME), compile_machine=machine())
    else:
        res.update(command=command(NAME), machine=machine())
    write_json(path, res)
    write_lines(RESULTS / "llm_profile.md", markdown(res))


def markdown(res: dict) -> list[str]:
    """The results page of ``res`` (``llm_profile.json``)."""
    lines = ["# What an LLM iteration costs, and what the untrained model does with each prompt", "",
             f"`{res['command']}` on {res['machine']['cpu_count']} CPUs ({res['machine']['processor'] or 'cpu'}).", ""]
    if "prompts" in res:
        lines += ["| format | example turn | commands | replies | invalid | won at once |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['format']} | {'yes' if r['example'] else 'no'} | {r['commands']} | {r['replies']} | "
                  f"{r['invalid']:.2f} | {r['won']:.2f} |" for r in res["prompts"]]
        lines.append("")
    if "iteration" in res:
        lines += ["| trained | parameters | 1st it. (s) | 2nd it. (s) | decode | games | update + rest | "
                  "peak RSS so far in the process (GiB) |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['trained_parameters']:,} | {r['first']['seconds']:.1f} | "
                  f"{r['second']['seconds']:.1f} | {r['second']['decode_s']:.1f} | {r['second']['env_s']:.1f} | "
                  f"{r['second']['update_s']:.1f} | {r['peak_rss_gib']:.1f} |" for r in res["iteration"]]
    if "compile" in res:
        m = res["compile_machine"]
        lines += ["", f"`{res['compile_command']}` on {m['cpu_count']} CPUs ({m['processor'] or 'cpu'}):", "",
                  "| trained | frozen parameters in the update program | lower (s) | compile (s) | HLO text (MiB) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['frozen']} | {r['lower_s']:.1f} | {r['compile_s']:.1f} | {r['hlo_mib']:.1f} |"
                  for r in res["compile"]]
    return lines


if __name__ == "__main__":
    main()
