"""A pretrained model's throughput in bepo_jax beside transformers, on the same machine and checkpoint.

SmolLM2-135M-Instruct (GGUF, dequantized to float32 by both): prefill (batch 1 and 8; 256 and 512
tokens), decode with the KV cache (batch 1, 8, 32: 64 new tokens after a 128-token prompt, prefill
included, as transformers' ``generate`` counts it), one training step (forward + backward of the
sequence log-likelihood over all parameters, batch 8 x 256), compile times, and memory. bepo_jax
runs here; transformers (torch on the CPU with the same thread count, or on the GPU with
``--torch-device cuda``) runs in the interpreter ``--torch-python`` names (an environment with
torch, transformers, accelerate and gguf: the reference must not share an environment with the code
it checks) as a subprocess of this run, one row set each.
llama.cpp (``llama-cpp-python``) is measured when it imports here; otherwise its row says so.

    python -m experiments.bench_llm --torch-python /path/to/venv/bin/python     # ~15 min on 2 cores
    python -m experiments.bench_llm --quick                                      # fewer repeats, no 512
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bepo_jax.agent.models import hub
from bepo_jax.agent.models.generate import generate
from bepo_jax.agent.models.interface import token_logprobs
from bepo_jax.agent.models.pretrained import load_pretrained
from experiments.common import ROOT, command, machine, median_seconds, parser, write_json, write_lines

PREFILL = ((1, 256), (8, 256), (1, 512), (8, 512))
DECODE = (1, 8, 32)
PROMPT, NEW = 128, 64
TRAIN = (8, 256)

# The transformers side: a standalone script (no bepo_jax import), run in the reference interpreter.
TORCH_SIDE = r'''
import json, statistics, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
gguf, threads, repeats, quick, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
torch.set_num_threads(threads)
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name, dtype=torch.float32).eval().to(device)
sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
rows = [dict(system="transformers", what="load", seconds=time.perf_counter() - t0)]
g = torch.Generator().manual_seed(0)
def timed(fn):
    fn(); sync()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
for b, n in ((1, 256), (8, 256)) + (() if quick else ((1, 512), (8, 512))):
    ids = torch.randint(0, 49152, (b, n), generator=g).to(device)
    with torch.no_grad():
        s = timed(lambda: model(ids))
    rows.append(dict(system="transformers", what="prefill", batch=b, tokens=n, seconds=s, tokens_per_s=b * n / s))
for b in (1, 8, 32):
    ids = torch.randint(0, 49152, (b, 128), generator=g).to(device)
    with torch.no_grad():
        s = timed(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, min_new_tokens=64,
                                         do_sample=False, pad_token_id=2))
    rows.append(dict(system="transformers", what="decode", batch=b, prompt=128, new=64, seconds=s, tokens_per_s=b * 64 / s))
ids = torch.randint(0, 49152, (8, 256), generator=g).to(device)
def step():
    model.zero_grad(set_to_none=True)
    out = model(ids)
    logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    (-logp.mean()).backward()
s = timed(step)
rows.append(dict(system="transformers", what="train_step", batch=8, tokens=256, seconds=s, tokens_per_s=8 * 256 / s))
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
rows.append(dict(system="transformers", what="peak_rss", gib=hwm / 2**20))
if device.startswith("cuda"):
    rows.append(dict(system="transformers", what="peak_device_memory", gib=torch.cuda.max_memory_allocated() / 2**30))
print(json.dumps(dict(rows=rows, torch=torch.__version__, transformers=__import__("transformers").__version__)))
'''


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux's VmHWM: its own address space's high-water mark;
    ``ru_maxrss`` would carry a parent's peak across exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 2**20


def _timed(fn, repeats: int) -> tuple[float, float]:
    """(first call's seconds: compile + run, median of ``repeats`` later calls)."""
    return median_seconds(fn, 1), median_seconds(fn, repeats)


def jax_rows(gguf: Path, repeats: int, quick: bool) -> list[dict]:
    rows = []
    t = time.perf_counter()
    pre = load_pretrained(gguf)
    rows.append(dict(system="bepo_jax", what="load", seconds=time.perf_counter() - t))
    model = pre.model
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)

    @jax.jit
    def forward(state, ids, mask):
        return nnx.merge(graphdef, state)(ids, mask)

    for b, n in PREFILL[:2] if quick else PREFILL:
        ids = jnp.asarray(rng.integers(0, pre.config.vocab, (b, n)), jnp.int32)
        mask = jnp.ones((b, n), bool)
        first, s = _timed(lambda: forward(state, ids, mask), repeats)
        rows.append(dict(system="bepo_jax", what="prefill", batch=b, tokens=n, seconds=s, tokens_per_s=b * n / s,
                         compile_s=first - s))
    for b in DECODE:
        prompts = [list(rng.integers(0, pre.config.vocab, PROMPT)) for _ in range(b)]
        run = lambda: generate(model, prompts, max_tokens=NEW, stop_ids=(), bucket=PROMPT)
        first, s = _timed(run, repeats)
        rows.append(dict(system="bepo_jax", what="decode", batch=b, prompt=PROMPT, new=NEW, seconds=s,
                         tokens_per_s=b * NEW / s, compile_s=first - s))

    b, n = TRAIN
    ids = jnp.asarray(rng.integers(0, pre.config.vocab, (b, n)), jnp.int32)
    mask = jnp.ones((b, n), bool)

    def loss(state):
        logp, _ = token_logprobs(nnx.merge(graphdef, state)(ids, mask), ids)
        return -jnp.mean(logp[:, 1:])

    grad = jax.jit(jax.value_and_grad(loss))
    first, s = _timed(lambda: grad(state), repeats)
    mem = grad.lower(state).compile().memory_analysis()
    temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    rows.append(dict(system="bepo_jax", what="train_step", batch=b, tokens=n, seconds=s, tokens_per_s=b * n / s,
                     compile_s=first - s, xla_temp_gib=None if temp is None else temp / 2**30))
    rows.append(dict(system="bepo_jax", what="peak_rss", gib=peak_rss_gib()))
    return rows


def llama_cpp_rows(gguf: Path, repeats: int) -> list[dict]:
    try:
        from llama_cpp import Llama
    except ImportError:
        return [dict(system="llama.cpp", what="not measured",
                     note="llama-cpp-python does not import here (it builds llama.cpp from source on install)")]
    llm = Llama(model_path=str(gguf), n_ctx=1024, n_threads=os.cpu_count(), verbose=False)
    prompt = list(np.random.default_rng(0).integers(0, 49152, PROMPT))
    ts = []
    for _ in range(repeats):
        llm.reset()
        t = time.perf_counter()
        n = 0
        for _tok in llm.generate(prompt, temp=0.0):
            n += 1
            if n == NEW:
                break
        ts.append(time.perf_counter() - t)
    s = statistics.median(ts)
    return [dict(system="llama.cpp", what="decode", batch=1, prompt=PROMPT, new=NEW, seconds=s, tokens_per_s=NEW / s,
                 note="its own Q4_1 kernels (no dequantization to float32)")]


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--torch-python", default=None, help="an interpreter with torch + transformers + gguf")
    p.add_argument("--model", default="smollm2-135m", help="a GGUF file or a fetched model's name")
    p.add_argument("--torch-device", default="cpu", help="where transformers runs: cpu (the same thread count) or cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results"))
    args = p.parse_args(argv)
    gguf = hub.resolve(args.model)
    t0 = time.perf_counter()
    rows = jax_rows(gguf, args.repeats, args.quick)
    ref = {}
    if args.torch_python:
        r = subprocess.run([args.torch_python, "-c", TORCH_SIDE, str(gguf), str(os.cpu_count()), str(args.repeats),
                            "1" if args.quick else "0", args.torch_device], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"the transformers side failed:\n{r.stderr[-3000:]}")
        ref = json.loads(r.stdout.strip().splitlines()[-1])
        rows += ref["rows"]
    rows += llama_cpp_rows(gguf, args.repeats)
    info = dict(command=command("bench_llm"), machine=machine(), model=str(gguf), wall_s=time.perf_counter() - t0,
                torch=ref.get("torch"), transformers=ref.get("transformers"), torch_device=args.torch_device, rows=rows)
    out = Path(args.out)
    write_json(out / "bench_llm.json", info, indent=1)
    m = info["machine"]
    lines = ["# A pretrained model in bepo_jax beside transformers (and llama.cpp)", "",
             f"Command: `{info['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, backend {m['backend']}; jax {m['jax']}; "
             f"torch {info['torch']}, transformers {info['transformers']} on {args.torch_device} "
             f"({'the same thread count' if args.torch_device == 'cpu' else 'the same device'}). Model: "
             f"SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32 by both). Median of {args.repeats} "
             "timed repeats after a first call (bepo_jax: compile time = the first call minus the median).", "",
             "| system | what | batch | tokens | seconds | tokens/s | compile s | note |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tokens = r.get("tokens") or (f"{r['prompt']} + {r['new']}" if "new" in r else "")
        tps = f"{r['tokens_per_s']:.1f}" if "tokens_per_s" in r else ""
        sec = f"{r['seconds']:.2f}" if "seconds" in r else (f"{r['gib']:.2f} GiB" if "gib" in r else "")
        comp = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else ""
        note = r.get("note", "") or (f"XLA temp {r['xla_temp_gib']:.2f} GiB" if r.get("xla_temp_gib") else "")
        lines.append(f"| {r['system']} | {r['what']} | {r.get('batch', '')} | {tokens} | {sec} | {tps} | {comp} | {note} |")
    write_lines(out / "bench_llm.md", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
