"""The experiments' runner: every program of ``experiments/`` by name, with what it does.

    python -m experiments                 # list them: name and the first line of its docstring
    python -m experiments NAME [ARGS...]  # run one: the same as python -m experiments.NAME ARGS...

A program is a module of this folder with a ``main(argv)``; the modules that only serve others
(``common``, ``llm_test``, ``dict_baselines``, ``readme_tables``' helpers) are not listed.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


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
        print(__doc__.strip().splitlines()[0], "\n")
        for name, line in found.items():
            print(f"  {name:<{width}}  {line}")
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
