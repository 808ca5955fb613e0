"""The layering holds: read the import graph of ``bepo_jax`` and ``experiments`` from their
sources (every import statement, function-level ones included) and fail on a circle or on an
import from a lower layer into a higher one.

Layers, lowest first (docs/architecture.md): ``bepo_jax.credit`` (the kernels) ->
``bepo_jax.integrations`` and ``bepo_jax.agent`` (side by side: neither imports the other) ->
``bepo_jax.lab`` and ``bepo_jax.integrations.tunix`` (Tunix's package: its model bridge reads the agent's
checkpoints) -> ``bepo_jax.demo`` / ``viz`` -> ``bepo_jax.cli`` -> ``experiments``. The package's
``__init__`` re-exports from the kernels (and the verl-style rows) only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# room -> layer; a module may import its own room and rooms of lower layers only
LAYERS = {
    "bepo_jax._version": 0,
    "bepo_jax.credit": 0,
    "bepo_jax.integrations": 1,
    "bepo_jax.agent": 1,
    "bepo_jax.lab": 2,
    "bepo_jax.integrations.tunix": 2,  # all of Tunix, its model bridge on the agent's checkpoint loader
    "bepo_jax.demo": 3, "bepo_jax.viz": 3,
    "bepo_jax.cli": 4,
    "experiments": 5,
}
# what the package's own __init__ (import bepo_jax: JAX and NumPy only) may import
ROOT_IMPORTS = ("bepo_jax._version", "bepo_jax.credit", "bepo_jax.integrations.rows")


def _modules(package: str) -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in sorted((ROOT / package).rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def import_graph(packages=("bepo_jax", "experiments")) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports. ``from pkg import sub`` is an edge to
    ``pkg.sub`` (not to ``pkg``'s ``__init__``) when ``sub`` is a module."""
    mods = {}
    for pkg in packages:
        mods.update(_modules(pkg))
    graph = {}
    for name, (path, is_pkg) in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                deps.update(subs)
                if target in mods and len(subs) < len(node.names):
                    deps.add(target)
        deps.discard(name)
        graph[name] = deps
    return graph


def room(module: str) -> str:
    """The longest LAYERS key that ``module`` lies in (``bepo_jax`` itself: its own room)."""
    best = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return max(best, key=len) if best else module


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        if mod == "bepo_jax":
            bad += [f"bepo_jax/__init__ imports {d} (only {', '.join(ROOT_IMPORTS)} keep `import bepo_jax` light)"
                    for d in sorted(deps) if not d.startswith(ROOT_IMPORTS)]
            continue
        r = room(mod)
        for d in sorted(deps):
            rd = room(d)
            if rd == "bepo_jax" and mod.startswith("bepo_jax."):
                bad.append(f"{mod} imports the package's __init__ ({d}); import the module that defines the name")
            elif rd != r and rd in LAYERS and LAYERS[rd] >= LAYERS[r]:
                bad.append(f"{mod} (layer {LAYERS[r]}, {r}) imports {d} (layer {LAYERS[rd]}, {rd})")
    return bad


def test_every_module_has_a_room():
    graph = import_graph()
    homeless = [m for m in graph if m != "bepo_jax" and room(m) not in LAYERS]
    assert not homeless, f"modules outside every layer (add them to a room or to LAYERS): {homeless}"


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (break each by moving the shared piece down a layer): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_import_runs_up_a_layer():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_only_the_experiments_tests_import_experiments():
    """Tests are laid out like the package: ``tests/experiments/`` holds every test of the experiments,
    and no other test reaches into them."""
    graph = import_graph(("tests", "bepo_jax", "experiments"))
    bad = sorted(m for m, deps in graph.items() if m.startswith("tests.") and not m.startswith("tests.experiments.")
                 and any(d == "experiments" or d.startswith("experiments.") for d in deps))
    assert not bad, f"tests outside tests/experiments/ import experiments: {bad}"
    assert not [m for m, deps in graph.items() if m.startswith("bepo_jax") and any(d.startswith("tests") for d in deps)]


# inside the agent stack (bepo_jax/agent/__init__.py): room -> order; a room imports its own and lower ones only
AGENT_LAYERS = {"bepo_jax.agent.envs": 0, "bepo_jax.agent.models": 0, "bepo_jax.agent.rollouts": 1,
                "bepo_jax.agent.rl": 1, "bepo_jax.agent.train": 2}


def agent_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports between the agent's rooms against ``AGENT_LAYERS`` (same order: side by side, none allowed)."""
    inside = lambda m: next((r for r in AGENT_LAYERS if m == r or m.startswith(r + ".")), None)
    bad = []
    for mod, deps in sorted(graph.items()):
        r = inside(mod)
        for d in sorted(deps):
            rd = inside(d)
            if r and rd and rd != r and AGENT_LAYERS[rd] >= AGENT_LAYERS[r]:
                bad.append(f"{mod} ({r}, order {AGENT_LAYERS[r]}) imports {d} ({rd}, order {AGENT_LAYERS[rd]})")
    return bad


def test_the_agent_rooms_keep_their_order():
    graph = import_graph(("bepo_jax",))
    rooms = {".".join(m.split(".")[:3]) for m in graph if m.startswith("bepo_jax.agent.") and m.count(".") >= 2}
    loose = sorted(m for m in graph if m.startswith("bepo_jax.agent.") and m.count(".") == 2
                   and not any(m == r or m.startswith(r + ".") for r in AGENT_LAYERS))
    assert not loose, f"modules loose at agent/'s root (put each in a room of AGENT_LAYERS): {loose}"
    assert rooms <= set(AGENT_LAYERS), sorted(rooms - set(AGENT_LAYERS))
    bad = agent_violations(graph)
    assert not bad, "imports against the agent's order:\n" + "\n".join(bad)
    assert agent_violations({"bepo_jax.agent.envs.a": {"bepo_jax.agent.train.loop"},
                             "bepo_jax.agent.rl.x": {"bepo_jax.agent.rollouts.chat"}}) == [
        "bepo_jax.agent.envs.a (bepo_jax.agent.envs, order 0) imports bepo_jax.agent.train.loop (bepo_jax.agent.train, order 2)",
        "bepo_jax.agent.rl.x (bepo_jax.agent.rl, order 1) imports bepo_jax.agent.rollouts.chat (bepo_jax.agent.rollouts, order 1)"]


def test_the_checker_sees_a_circle_and_an_upward_import():
    """The checks fail where they should: a made-up graph with a circle and an upward edge."""
    g = {"bepo_jax.credit.a": {"bepo_jax.credit.b"}, "bepo_jax.credit.b": {"bepo_jax.credit.a"},
         "bepo_jax.credit.c": {"bepo_jax.agent.x"}, "bepo_jax.agent.x": set(),
         "bepo_jax.agent.y": {"bepo_jax.integrations.z"}, "bepo_jax.integrations.z": set()}
    assert circles(g) == [["bepo_jax.credit.a", "bepo_jax.credit.b"]]
    bad = layer_violations(g)
    assert any(s.startswith("bepo_jax.credit.c ") for s in bad) and any(s.startswith("bepo_jax.agent.y ") for s in bad)
    assert len(bad) == 2


@pytest.mark.parametrize("rel", ["from . import b", "from .b import f", "import bepo_jax.credit.b"])
def test_the_reader_resolves_relative_and_absolute_imports(tmp_path, monkeypatch, rel):
    pkg = tmp_path / "bepo_jax" / "credit"
    pkg.mkdir(parents=True)
    (tmp_path / "bepo_jax" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(f"def g():\n    {rel}\n")
    (pkg / "b.py").write_text("def f():\n    pass\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert import_graph(("bepo_jax",))["bepo_jax.credit.a"] == {"bepo_jax.credit.b"}
