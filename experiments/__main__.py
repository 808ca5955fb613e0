"""The experiments' runner: every program of ``experiments/`` by name, with what it does.

    python -m experiments                 # list them: name and the first line of its docstring
    python -m experiments NAME [ARGS...]  # run one: the same as python -m experiments.NAME ARGS...

A program is a module of this folder with a ``main(argv)``; the modules that only serve others
(``common``, ``llm_test``, ``dict_baselines``, ``formatting``) are not listed. The list is grouped by
purpose (``PURPOSES``: every program belongs to one, ``tests/experiments/test_runner.py``).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# what each program is for: the listing's groups, in this order
PURPOSES = {
    "the paper's claims (character policy)": ("claims", "confirmatory", "collapse_escape", "credit_mass",
                                              "learning_rate", "warm_start", "rescore", "pool_overlap"),
    "the LLM runs": ("llm_learning", "llm_recipe_sweep", "llm_sweep_heldout", "llm_pilot", "llm_confirmatory",
                     "llm_confirmatory_2", "textworld_structure"),
    "the credit lab": ("credit_lab", "credit_protocol", "tabular_learning", "tabular_step_size",
                       "similarity_agreement"),
    "against outside code": ("g2po_official", "proxmo_official", "verl_official", "tunix_serial_calls"),
    "benchmarks and profiles": ("bench_advantages", "bench_chat_cache", "bench_env_loop", "bench_llm",
                                "bench_llm_memory", "bench_prefill", "bench_seeds", "bench_train_step",
                                "bench_tunix_adapter", "profile_llm", "profile_recipe"),
    "records and the house": ("record_main_job", "readme_tables", "config_walk"),
}


def programs() -> dict[str, str]:
    """name -> the first line of its docstring, for every module here with a top-level ``main`` and a
    ``__main__`` guard (read from the sources: nothing is imported)."""
    out = {}
    for p in sorted(HERE.glob("*.py")):
        if p.name.startswith("_"):
            continue
        tree = ast.parse(p.read_text(), str(p))
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        guarded = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        if has_main and guarded:
            out[p.stem] = (ast.get_docstring(tree) or "").strip().splitlines()[0] if ast.get_docstring(tree) else ""
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    found = programs()
    if not argv or argv[0] in ("-h", "--help", "list"):
        width = max(map(len, found))
        print(__doc__.strip().splitlines()[0])
        grouped = [n for names in PURPOSES.values() for n in names]
        for purpose, names in [*PURPOSES.items(), ("other", tuple(n for n in found if n not in grouped))]:
            names = [n for n in names if n in found]
            if names:
                print(f"\n{purpose}:")
                for name in names:
                    print(f"  {name:<{width}}  {found[name]}")
        print("\nRun one: python -m experiments NAME [--help]")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in found:
        close = [n for n in found if name in n or n in name]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        print(f"experiments: no program {name!r}{hint}; `python -m experiments` lists them.", file=sys.stderr)
        return 2
    result = importlib.import_module(f"experiments.{name}").main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
