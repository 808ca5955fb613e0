"""The walk of a run's config through the code: which modules it visits, and how often it comes back.

Runs two tiny training runs, the character policy's (Sokoban, 2 iterations, 2 groups x 2 trajectories,
2 evaluation tasks) and a chat model's (a tiny random Qwen2 checkpoint from ``tests/fixtures/llm`` playing
Sokoban's rendered text, 1 iteration), and records, in order, every place in ``bepo_jax`` that touches the
run's config: a read of one of its fields, or a call that receives it as an argument (``RunConfig``, or one
of ``train.parts``' frozen parts). A module is a *room*; consecutive touches in one room are one *stay*; a
stay in a room the walk had already left is a *return*. A function counts once, where it first touches the
config (a reader reads a place once: an iteration's second turn adds nothing). Fewer returns: a reader following the config meets
each module once, in order (issue "The house, second step": at most 10 returns).

    python -m experiments.config_walk            # prints the walk, writes experiments/results/config_walk.json
    python -m experiments.config_walk --no-write  # prints only

The config's own rooms (``train.config``, ``train.parts``, and ``credit.configs``' dict methods and
validators: construction, validation, ``replace``, the stored dict) are not counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .common import ROOT, write_json

OUT = ROOT / "experiments" / "results" / "config_walk.json"


def _config_types() -> tuple[type, ...]:
    from bepo_jax.agent.train import config as config_module

    types = [config_module.RunConfig]
    try:
        from bepo_jax.agent.train import parts
    except ImportError:  # before the config came in parts
        return tuple(types)
    return tuple(types) + tuple(parts.PARTS)


# the config's own rooms: its definition, its parts, and the dict methods and validators every config shares
OWN = ("agent.train.config", "agent.train.parts", "credit.configs")


def walk(cfg, run_dir: Path, *, once: bool = True) -> list[str]:
    """The modules (dotted names under ``bepo_jax``) that touch ``cfg`` or a part of it while ``train``
    runs it, in order: one entry per function that touches it, where it first does (``once``), or one per
    touch (every read of every iteration)."""
    import dataclasses

    from bepo_jax.agent.train import train

    types = _config_types()
    touches: list[str] = []
    sites: set[tuple[str, str]] = set()
    field_names = {t: {f.name for f in dataclasses.fields(t)} for t in types}

    def record(frame) -> None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("bepo_jax") and not module.endswith(OWN):
            site = (module, frame.f_code.co_qualname)
            if not once or site not in sites:  # a reader reads a place once: a loop's later turns add nothing
                sites.add(site)
                touches.append(module)

    originals = {t: t.__getattribute__ for t in types}

    def reading(t):
        base, names = originals[t], field_names[t]

        def __getattribute__(self, name):
            if name in names:
                record(sys._getframe(1))
            return base(self, name)

        return __getattribute__

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(isinstance(frame.f_locals.get(n), types) for n in names):
            record(frame)

    for t in types:
        t.__getattribute__ = reading(t)
    sys.setprofile(hook)
    try:
        train(cfg, run_dir, progress=False)
    finally:
        sys.setprofile(None)
        for t, f in originals.items():
            t.__getattribute__ = f
    return touches


def tiny_chat_model(d: Path) -> Path:
    """The tiny random Qwen2 checkpoint of the tests' fixtures under ``d``, its tokenizer unpacked, its
    context widened to 2048 positions (Sokoban's chat prompt is longer than its 128) and its 512-row
    embedding and head widened with random rows to its tokenizer's 49152 tokens (text past the rows is
    refused: ``PretrainedTokenizer.model_vocab``)."""
    import gzip
    import json
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copytree(ROOT / "tests" / "fixtures" / "llm" / "tiny_qwen2", d)
    (d / "tokenizer.json").write_bytes(gzip.decompress((d / "tokenizer.json.gz").read_bytes()))
    (d / "tokenizer.json.gz").unlink()
    vocab = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
    config = json.loads((d / "config.json").read_text())
    rows = max(len(vocab), config["vocab_size"])
    (d / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048, "vocab_size": rows}))
    weights = load_file(str(d / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = weights[name]
        extra = (rng.standard_normal((rows - w.shape[0], w.shape[1])) * 0.02).astype(w.dtype)
        weights[name] = np.concatenate([w, extra])
    save_file(weights, str(d / "model.safetensors"))
    return d


def configs(tmp: Path) -> dict:
    """The two walked runs: the character policy's and a chat model's, each as small as a run goes."""
    from bepo_jax.agent.train import RunConfig

    char = RunConfig(env="sokoban", iterations=2, groups=2, group_size=2, eval_tasks=2, eval_every=2, layers=1,
                     width=32, heads=2, task_pool=8, checkpoint_every=2)
    chat = RunConfig(env="sokoban", model=str(tiny_chat_model(tmp / "model")), iterations=1, groups=1, group_size=2,
                     eval_tasks=1, eval_every=1, max_steps=2, max_reply=4, max_prompt=1024, train_layers=1,
                     task_pool=2, constrained=False, eval_train=False, checkpoint_every=1)
    return {"character": char, "chat": chat}


def stays(calls: list[str]) -> list[str]:
    """Consecutive calls in one module as one stay."""
    return [m for i, m in enumerate(calls) if i == 0 or calls[i - 1] != m]


def summary(calls: list[str]) -> dict:
    s = stays(calls)
    seen, returns = set(), []
    for m in s:
        if m in seen:
            returns.append(m)
        seen.add(m)
    by_room = {m: returns.count(m) for m in sorted(set(returns), key=lambda m: -returns.count(m))}
    return {"rooms": len(seen), "stays": len(s), "returns": len(returns), "returns_by_room": by_room, "walk": s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in configs(Path(tmp)).items():
            out[name] = summary(walk(cfg, Path(tmp) / name))
            out[name]["every_touch"] = {k: v for k, v in summary(walk(cfg, Path(tmp) / f"{name}_all", once=False)).items()
                                        if k != "walk"}
    for name, o in out.items():
        t = o["every_touch"]
        print(f"{name}: rooms {o['rooms']}, stays {o['stays']}, returns {o['returns']} "
              f"(every touch: stays {t['stays']}, returns {t['returns']})")
        for m, n in o["returns_by_room"].items():
            print(f"  {n} x {m}")
        print("  walk:", " -> ".join(m.removeprefix("bepo_jax.") for m in o["walk"]))
    if not args.no_write:
        write_json(OUT, {"command": "python -m experiments.config_walk", **out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
