"""Multi-turn cache reuse in the chat rollouts: what an LLM iteration costs with and without it.

    python -m experiments.bench_chat_cache                          # every variant, 6 iterations each
    python -m experiments.bench_chat_cache --before bdb252b         # and the code before reuse, same run
    python -m experiments.bench_chat_cache --torch-python PY        # and transformers' generate on the same chats

The ``llm_textworld`` recipe's iteration (SmolLM2-135M-Instruct, 2 games x 4 episodes x at most
4 turns, the top 2 blocks trained) run ``--iterations`` times per variant in this process:
``reuse_cache`` on and off, with one earlier turn shown (the recipe's ``prompt_history=1``: the
window slides every turn, so only the shared part of the chat is kept) and with the whole episode
shown (``prompt_history=3``: every turn extends the last). Per iteration: seconds, split into
decoding (prefill + replies), stepping the games and the rest (advantages, the update, building
prompts); the prompt tokens of the live rows (what running every prompt whole computes), the
tokens actually run through the model, the shared prefix; reply tokens per second of decoding;
the sampling programs compiled so far.

``--before COMMIT``: the same recipe iterations run by that commit's code (a git worktree, its own
process), the baseline "today". ``--torch-python``: an interpreter with torch, transformers and
gguf runs ``generate`` (sampling, the KV cache within a call, nothing kept across turns) on the
prompts of the last iteration of the reuse variant, turn by turn, batched as the rollout batches
them; its reply tokens per second beside ours on the same chats.

Results: ``experiments/results/bench_chat_cache.json`` and ``.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from bepo_jax.agent.train.recipes import recipe

from .common import RESULTS, ROOT, checkout, command, git_commit, machine, parser, write_json, write_lines

NAME = "bench_chat_cache"
GAMES = ROOT / "runs" / ".textworld_games"
VARIANTS = [  # name, prompt_history, reuse_cache
    ("no reuse, 1 earlier turn shown (recipe)", 1, False),
    ("reuse, 1 earlier turn shown (recipe)", 1, True),
    ("no reuse, whole episode shown", 3, False),
    ("reuse, whole episode shown", 3, True),
]

# The baseline: the same iterations by another commit's code, in its own worktree and process (the code
# there has no reuse_cache; only the recipe's RunConfig and LLMSetup.iterate, which both have).
BEFORE_SIDE = r"""
import json, sys, time
from pathlib import Path
from bepo_jax.agent.train.llm_setup import LLMSetup
from bepo_jax.agent.train.recipes import recipe
iterations, games = int(sys.argv[1]), Path(sys.argv[2])
setup = LLMSetup(recipe("llm_textworld"), cache_dir=games)
state = setup.init_state()
rows = []
for it in range(1, iterations + 1):
    t0 = time.perf_counter()
    state, m = setup.iterate(state, it)
    rows.append(dict(seconds=time.perf_counter() - t0, decode_s=m["rollout/decode_s"], env_s=m["rollout/env_s"],
                     update_s=m["update_s"], turns=m["env_steps"], compiles=m["rollout/compiles"],
                     reply_tokens_per_s=m["rollout/reply_tokens_per_s"]))
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
print(json.dumps(rows))
"""

# transformers' generate over the same chats: a standalone script (no bepo_jax import).
TORCH_SIDE = r"""
import json, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
gguf, threads, chats = sys.argv[1], int(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name, dtype=torch.float32).eval()
torch.manual_seed(0)
rows = []
for turn in chats["turns"]:
    prompts = turn["prompts"]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[chats["pad"]] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=chats["max_reply"], do_sample=True,
                             temperature=chats["temperature"], top_k=0, top_p=1.0, eos_token_id=chats["stop"],
                             pad_token_id=chats["pad"])
    s = time.perf_counter() - t0
    new = out[:, width:]
    ended = torch.isin(new, torch.tensor(chats["stop"]))
    n = torch.where(ended.any(1), ended.int().argmax(1) + 1, torch.full((len(prompts),), new.shape[1])).sum().item()
    rows.append(dict(rows=len(prompts), prompt_tokens=sum(len(p) for p in prompts), reply_tokens=int(n), seconds=s))
print(json.dumps(dict(rows=rows, torch=torch.__version__, transformers=__import__("transformers").__version__)))
"""


def _setup(history: int, reuse: bool):
    from bepo_jax.agent.rollouts.chat import ChatRollout
    from bepo_jax.agent.train.llm_setup import LLMSetup

    setup = LLMSetup(recipe("llm_textworld").replace(prompt_history=history), cache_dir=GAMES)
    cfg = dataclasses.replace(setup.rollout_cfg, reuse_cache=reuse)
    setup.rollout_cfg = cfg
    setup.rollout = ChatRollout(setup.pretrained, setup.trainer.graphdef, setup.trainer.rest, setup.env.chat_env, cfg,
                                max_steps=setup.max_steps)
    return setup


def run_variant(history: int, reuse: bool, iterations: int):
    setup = _setup(history, reuse)
    state = setup.init_state()
    rows = []
    for it in range(1, iterations + 1):
        t0 = time.perf_counter()
        state, m = setup.iterate(state, it)
        t = setup.rollout.timing
        rows.append(dict(seconds=time.perf_counter() - t0, decode_s=m["rollout/decode_s"], env_s=m["rollout/env_s"],
                         update_s=m["update_s"], turns=m["env_steps"], compiles=m["rollout/compiles"],
                         reply_tokens_per_s=m["rollout/reply_tokens_per_s"], prompt_tokens=t["prompt_tokens"],
                         prefill_tokens=t["prefill_tokens"], shared_prefix=t["shared_prefix"],
                         sequence_length=int(setup.last_rollout.tokens.shape[-1])))
        print(json.dumps(rows[-1]), flush=True)
    return setup, rows


def chats_of(setup) -> dict:
    """The prompts of the last rollout, turn by turn (the live rows of each turn)."""
    ro = setup.last_rollout
    tokens, mask, resp, valid = map(np.asarray, (ro.tokens, ro.mask, ro.response_mask, ro.batch.mask))
    T = tokens.shape[2]
    turns = []
    for t in range(T):
        live = valid[:, :, t].reshape(-1)
        tok, m, r = (x[:, :, t].reshape(-1, x.shape[-1]) for x in (tokens, mask, resp))
        prompts = [tok[i][m[i] & ~r[i]].tolist() for i in np.flatnonzero(live)]
        if prompts:
            turns.append({"prompts": prompts})
    tk = setup.pretrained.tokenizer
    return {"turns": turns, "pad": int(tk.pad_id), "stop": [int(i) for i in tk.end_of_turn_ids],
            "max_reply": setup.rollout_cfg.max_reply, "temperature": setup.rollout_cfg.temperature}


SKIP = 2  # the first iterations, which compile most, are left out of the means


def summarize(rows: list[dict]) -> dict:
    """Means over iterations SKIP + 1 .. n (the same iterations for every variant: with and without
    reuse at one history they are the same episodes, the samples being equal)."""
    warm = rows[SKIP:] or rows
    mean = lambda k: float(np.mean([r[k] for r in warm])) if k in warm[0] else None
    return {k: mean(k) for k in ("seconds", "decode_s", "env_s", "update_s", "turns", "prompt_tokens",
                                 "prefill_tokens", "shared_prefix", "reply_tokens_per_s", "sequence_length")} | {
        "first_s": rows[0]["seconds"], "compiles": rows[-1]["compiles"],
        "compiled_after_skip": rows[-1]["compiles"] - rows[min(SKIP, len(rows)) - 1]["compiles"],
        "mean_s": float(np.mean([r["seconds"] for r in rows]))}


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--iterations", type=int, default=6, help="iterations per variant (the first ones compile)")
    p.add_argument("--before", default=None, help="a commit whose code runs the recipe as the baseline")
    p.add_argument("--torch-python", default=None, help="an interpreter with torch + transformers + gguf")
    p.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = p.parse_args(argv)
    if args.render:
        res = json.loads((RESULTS / f"{NAME}.json").read_text())
        for v in res["variants"]:
            v.update(summarize(v["rows"]))
        write_lines(RESULTS / f"{NAME}.md", render(res))
        return
    t_start = time.perf_counter()
    res = {"command": command(NAME, argv), "machine": machine(), "commit": git_commit(),
           "iterations": args.iterations, "variants": []}
    if args.before:
        with checkout(args.before) as tree:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            r = subprocess.run([sys.executable, "-c", BEFORE_SIDE, str(args.iterations), str(GAMES)], cwd=tree, env=env,
                               capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"the baseline failed:\n{r.stderr[-3000:]}")
        rows = json.loads(r.stdout.strip().splitlines()[-1])
        res["variants"].append({"variant": f"before: commit {args.before}, 1 earlier turn shown (recipe)",
                                "history": 1, "reuse": None, "rows": rows, **summarize(rows)})
        print(res["variants"][-1]["variant"], summarize(rows), flush=True)
    chats = None
    for name, history, reuse in VARIANTS:
        setup, rows = run_variant(history, reuse, args.iterations)
        res["variants"].append({"variant": name, "history": history, "reuse": reuse, "rows": rows, **summarize(rows)})
        if reuse and history == 3:
            chats = chats_of(setup)
            ours = rows[-1]
        del setup
    if args.torch_python and chats is not None:
        from bepo_jax.agent.models import hub

        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(chats, f)
        r = subprocess.run([args.torch_python, "-c", TORCH_SIDE, str(hub.resolve("smollm2-135m")),
                            str(os.cpu_count()), f.name], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"the transformers side failed:\n{r.stderr[-3000:]}")
        ref = json.loads(r.stdout.strip().splitlines()[-1])
        secs = sum(x["seconds"] for x in ref["rows"])
        res["transformers"] = {**ref, "seconds": secs,
                               "reply_tokens_per_s": sum(x["reply_tokens"] for x in ref["rows"]) / secs,
                               "ours_decode_s": ours["decode_s"], "ours_reply_tokens_per_s": ours["reply_tokens_per_s"]}
    res["wall_s"] = time.perf_counter() - t_start
    write_json(RESULTS / f"{NAME}.json", res)
    write_lines(RESULTS / f"{NAME}.md", render(res))


def render(res: dict) -> list[str]:
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"
    lines = ["# Multi-turn cache reuse: an LLM iteration's cost", "",
             f"`{res['command']}` at {res['commit']} on {res['machine'].get('cpu_count')} CPUs; "
             f"{res['iterations']} iterations per variant (the same seeds); the columns up to 'sequence length' are "
             f"means over iterations {SKIP + 1}-{res['iterations']} (the first {SKIP} compile most; with and without "
             "reuse at one history these are the same episodes), then the sampling programs compiled in all and "
             f"during those iterations, the first iteration's seconds, and the mean over every iteration.", "",
             "| variant | s / iteration | decode | games | update + rest | turns | prompt tokens | run through the "
             "model | shared prefix | reply tokens / s | sequence length | programs (in the means) | 1st it. (s) | "
             "mean, all (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v in res["variants"]:
        lines.append(f"| {v['variant']} | {f(v['seconds'])} | {f(v['decode_s'])} | {f(v['env_s'], 2)} | "
                     f"{f(v['update_s'])} | {f(v['turns'])} | {f(v['prompt_tokens'], 0)} | {f(v['prefill_tokens'], 0)} | "
                     f"{f(v['shared_prefix'], 0)} | {f(v['reply_tokens_per_s'])} | {f(v['sequence_length'], 0)} | "
                     f"{v['compiles']:.0f} ({v['compiled_after_skip']:.0f}) | {f(v['first_s'])} | {f(v['mean_s'])} |")
    tr = res.get("transformers")
    if tr:
        lines += ["", f"transformers {tr['transformers']} (torch {tr['torch']}, CPU) `generate` on the same chats (the "
                  "last iteration of \"reuse, whole episode shown\", turn by turn, batched as the rollout batches them): "
                  f"{tr['seconds']:.1f} s, {tr['reply_tokens_per_s']:.1f} reply tokens/s; bepo_jax on those turns "
                  f"{tr['ours_decode_s']:.1f} s, {tr['ours_reply_tokens_per_s']:.1f} reply tokens/s."]
    return lines


if __name__ == "__main__":
    main()
