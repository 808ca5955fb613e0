"""The model commands of docs/models.md run as a user types them (the installed ``bepo-jax``
script in a fresh process), at a tiny size: ``--max-tokens`` capped, and the page's
``path/to/Qwen2.5-1.5B-Instruct`` replaced by the tiny random Qwen2 checkpoint."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bepo_jax.agent.models import hub

from .conftest import write_tiny_chat_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "bepo-jax"
pytestmark = [pytest.mark.xdist_group("smollm2"),
              pytest.mark.skipif(not hub.path_of("smollm2-135m").exists(),
                                 reason="run `bepo-jax models fetch smollm2-135m` (make test does)")]


def _typed(page: str) -> list[list[str]]:
    """The ``bepo-jax`` lines of ``page``'s shell blocks, comments dropped, as argument lists."""
    text = (ROOT / page).read_text()
    lines = [ln.split("  #")[0].strip() for body in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
             for ln in body.splitlines()]
    return [shlex.split(ln) for ln in lines if ln.startswith("bepo-jax ")]


def test_the_model_commands_of_the_docs_run_as_typed(tmp_path):
    tiny = write_tiny_chat_model(tmp_path / "tiny_llama")  # its embedding covers its tokenizer
    commands = _typed("docs/models.md")
    assert {tuple(c[:2]) for c in commands} >= {("bepo-jax", "models"), ("bepo-jax", "generate")}
    seen = set()
    for words in commands:
        args = [str(tiny) if w == "path/to/Qwen2.5-1.5B-Instruct" else w for w in words[1:]]
        if args[0] == "generate":
            args += ["--max-tokens", "8" if "smollm2-135m" in args else "3"]  # the last one given wins
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"`{shlex.join(words)}` failed:\n{done.stderr[-2000:]}"
        out = done.stdout
        if args[:2] == ["models", "fetch"]:
            assert out.strip().endswith(str(hub.path_of("smollm2-135m")))  # the cached, verified file's path
        elif args[:2] == ["models", "list"]:
            assert "smollm2-135m" in out
        elif args[0] == "generate" and "smollm2-135m" in args:
            assert "Paris" in out, out  # the model knows it; greedy by default
        elif args[0] == "generate":  # a random tiny model may well reply with its end token at once
            assert out.endswith("\n") and "Traceback" not in done.stderr
        seen.add(tuple(args[:2]))
    assert len(seen) >= 3
