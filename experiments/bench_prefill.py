"""What the pretrained model's prefill costs in memory, against the full forward whose last position
it returns (SmolLM2-135M-Instruct, float32, CPU).

The chat rollout prefills every distinct prompt of a turn together (``LlamaLM.prefill``). The full
forward's output head makes logits at every prompt position ([rows, P, 49,152] floats: about 138 MB
per row at P = 704); the prefill runs the last block's queries and MLP and the head at the last
position only (it ran the full forward and kept the last position until the LLM confirmatory test,
whose protocol fixed the computation, had finished). Three programs over the same left-padded prompts
of P tokens, compiled once each (XLA's own ``memory_analysis``: the temporary buffers of one call, no
execution needed):

* ``prefill``       ``model.prefill(prompts, mask, P + 24)``: what the rollout runs (with its cache);
* ``forward_last``  ``model(prompts, mask)[:, -1]``: the full forward's last position (the former prefill's
  logits);
* ``score_last``    ``model.score(prompts, mask, P - 1)[:, -1]``: the same logits as ``prefill``'s,
  without the cache.

At ``--run-rows`` rows the three also run once: seconds, and the largest difference between the
prefill's logits and the full forward's (float32 rounding: different matmul shapes reduce in another
order).

    python -m experiments.bench_prefill            # ~3 minutes on 2 cores
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from bepo_jax.agent.models import hub
from bepo_jax.agent.models.pretrained import load_pretrained
from experiments.common import RESULTS, command, machine, parser, write_json, write_lines

REPLY = 24  # the LLM recipe's max_reply


def programs(model, P: int) -> dict:
    return {"prefill": lambda t, m: model.prefill(t, m, P + REPLY),
            "forward_last": lambda t, m: model(t, m)[:, -1],
            "score_last": lambda t, m: model.score(t, m, P - 1)[:, -1]}


def prompts(rows: int, P: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` random prompts of P tokens, each left-padded by up to a third of P (as the rollout pads)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((rows, P), bool)
    for i in range(rows):
        mask[i, : rng.integers(0, P // 3)] = False
    return np.where(mask, rng.integers(0, 49_000, (rows, P)), 0).astype(np.int32), mask


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--rows", default="8,32,96", help="prompt rows per call (the protocol's evaluation decodes 96)")
    p.add_argument("--tokens", type=int, default=704, help="prompt length P (a multiple of the rollout's bucket 64)")
    p.add_argument("--run-rows", type=int, default=8, help="rows at which forward_last and score_last also run")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    model = load_pretrained(hub.fetch("smollm2-135m", quiet=True), dtype="float32").model
    P, rows_list = args.tokens, [int(x) for x in args.rows.split(",")]
    rows = []
    for n in rows_list:
        t, m = prompts(n, P)
        for name, fn in programs(model, P).items():
            c = jax.jit(fn).lower(t, m).compile()
            mem = c.memory_analysis()
            row = dict(program=name, rows=n, tokens=P, temp_gib=mem.temp_size_in_bytes / 2**30,
                       output_gib=mem.output_size_in_bytes / 2**30)
            if n == args.run_rows:
                t0 = time.perf_counter()
                out = jax.block_until_ready(c(t, m))
                row["logits"] = np.asarray(out[0] if name == "prefill" else out)
                row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(name, n, f"{row['temp_gib']:.2f} GiB", flush=True)
    ran = {r["program"]: r.pop("logits") for r in rows if "logits" in r}
    diff = float(np.abs(ran["forward_last"] - ran["prefill"]).max()) if ran else None
    info = dict(command=command("bench_prefill"), machine=machine(), model="smollm2-135m", rows=rows,
                max_logit_difference=diff, run_rows=args.run_rows)
    out = Path(args.out)
    write_json(out / "bench_prefill.json", info)
    lines = ["# The pretrained model's prefill: memory, and logits at the last position only", "",
             f"`{info['command']}`; SmolLM2-135M-Instruct, float32, prompts of {P} tokens (left-padded); "
             "XLA's memory_analysis of one compiled call (temporary buffers; the output separately); "
             f"seconds of one call at {args.run_rows} rows.", "",
             "| program | rows | XLA temp (GiB) | output (GiB) | seconds |", "|---|---|---|---|---|"]
    for r in rows:
        sec = f"{r['seconds']:.1f}" if "seconds" in r else ""
        lines.append(f"| {r['program']} | {r['rows']} | {r['temp_gib']:.2f} | {r['output_gib']:.3f} | {sec} |")
    if diff is not None:
        lines += ["", f"Largest difference between prefill's and forward_last's logits at {args.run_rows} rows: "
                      f"{diff:.2g} (float32 rounding)."]
    write_lines(out / "bench_prefill.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
