"""A Sokoban solver and a noisy expert that writes demonstrations (the warm start's data).

For one level the solver explores every state (player cell, box cells) reachable within
``max_steps`` moves by breadth-first search, with the environment's rules (walk onto a
free cell; push a box when the cell behind it holds neither wall nor box; a move into a
wall or into an immovable box leaves the state as it is), then runs a second breadth-first
search backwards from the solved states of that graph:

    dist(s) = 0 if every box is on a target,   dist(s) = 1 + min_{a} dist(move(s, a))

(infinite where no solved state is reachable within the explored graph). A state at depth
d with d + dist(s) <= max_steps has its true shortest distance: every state on a shortest
path from it lies within the explored depth. The expert at s takes an action minimising
dist(move(s, a)) (ties broken at random); with probability ``noise`` it takes a uniformly
random action instead, and always at a state from which nothing is solvable in time
(``corruption="step"``), or it errs systematically at a fixed share ``noise`` of the states
(``corruption="state"``: a peaked expert with mistakes; ``demonstrations``).
That is the demonstration a warm start clones: the share ``noise`` of random actions sets
how good the cloned policy is (docs/training.md, "A supervised warm start").

Pure NumPy/Python on the host (one level: a few hundred states at the 6x6 recipe).
"""

from __future__ import annotations

from collections import deque

import numpy as np

# The four moves (up, down, left, right) as (row, column) steps: the environment's ``step`` reads
# them from here, so the solver's rules and the environment's are one table.
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)

Node = tuple[int, int]  # (player cell index, box cells as a bitmask)


def _cells(mask: np.ndarray) -> int:
    return int(sum(1 << int(i) for i in np.flatnonzero(np.asarray(mask).reshape(-1))))


def _move(node: Node, a: int, walls: np.ndarray, W: int) -> Node:
    """The environment's rule for one move (``sokoban.step``) on a node."""
    player, boxes = node
    r, c = divmod(player, W)
    dr, dc = int(MOVES[a][0]), int(MOVES[a][1])
    H = walls.shape[0]
    nr, nc = r + dr, c + dc
    if not (0 <= nr < H and 0 <= nc < W) or walls[nr, nc]:
        return node
    nxt = nr * W + nc
    if boxes >> nxt & 1:
        br, bc = nr + dr, nc + dc
        if not (0 <= br < H and 0 <= bc < W) or walls[br, bc] or boxes >> (br * W + bc) & 1:
            return node
        boxes = (boxes & ~(1 << nxt)) | (1 << (br * W + bc))
    return nxt, boxes


class LevelSolver:
    """Distances to a solved state for every node within ``max_steps`` moves of a level's start."""

    def __init__(self, level, max_steps: int):
        walls = np.asarray(level.walls, bool)
        self.walls, self.W = walls, walls.shape[1]
        self.targets = _cells(level.targets)
        player = np.asarray(level.player)
        self.start: Node = (int(player[0]) * self.W + int(player[1]), _cells(level.boxes))
        depth = {self.start: 0}
        succ: dict[Node, list[Node]] = {}
        queue = deque([self.start])
        while queue:
            node = queue.popleft()
            succ[node] = [_move(node, a, walls, self.W) for a in range(4)]
            if depth[node] == max_steps or self.solved(node):
                continue
            for nxt in succ[node]:
                if nxt not in depth:
                    depth[nxt] = depth[node] + 1
                    queue.append(nxt)
        pred: dict[Node, set[Node]] = {}
        for node, nxts in succ.items():
            for nxt in nxts:
                pred.setdefault(nxt, set()).add(node)
        self.succ = succ
        self.dist = {node: 0 for node in depth if self.solved(node)}
        queue = deque(self.dist)
        while queue:
            node = queue.popleft()
            for p in pred.get(node, ()):
                if p not in self.dist:
                    self.dist[p] = self.dist[node] + 1
                    queue.append(p)

    def solved(self, node: Node) -> bool:
        return node[1] & ~self.targets == 0

    def distance(self, node: Node) -> float:
        return self.dist.get(node, float("inf"))

    def best_actions(self, node: Node) -> list[int]:
        """The actions that minimise the successor's distance (empty where none is finite)."""
        nxts = self.succ.get(node) or [_move(node, a, self.walls, self.W) for a in range(4)]
        d = [self.distance(n) for n in nxts]
        best = min(d)
        return [] if best == float("inf") else [a for a in range(4) if d[a] == best]


CORRUPTIONS = ("step", "state")


def _unit(node: Node, seed: int, salt: int) -> float:
    """A fixed pseudo-random number in [0, 1) of (node, seed, salt) (splitmix64 of their mix)."""
    x = (node[0] * 0x9E3779B97F4A7C15 + node[1] * 0xBF58476D1CE4E5B9 + seed * 0x94D049BB133111EB + salt) & (2**64 - 1)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mult) & (2**64 - 1)
    return ((x ^ (x >> 31)) >> 11) / float(1 << 53)


def demonstrations(levels, *, max_steps: int, noise: float, seed: int,
                   corruption: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """The noisy expert's episode on every level: actions int32 [N, max_steps] (-1 after the
    episode ends) and success bool [N] (the expert's own record; replaying the actions in the
    environment gives the same). ``noise`` in [0, 1] is the share of corrupted decisions:

    * ``corruption="step"``: each step takes a uniformly random action with probability
      ``noise`` (a cloned policy spreads that mass over every action: it stays broad);
    * ``corruption="state"``: a fixed share ``noise`` of the states (chosen by a hash of the
      state and ``seed``) get one fixed wrong action, every other state one fixed optimal
      action (ties broken by the same hash): a deterministic expert with systematic
      mistakes, whose clone is peaked -- the regime of a competent supervised model.
    """
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"demonstrations: noise={noise!r} must lie in [0, 1] (the share of corrupted decisions).")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"demonstrations: corruption={corruption!r}; use one of {CORRUPTIONS}.")
    rng = np.random.default_rng(seed)
    n = int(np.asarray(levels.player).shape[0])
    actions = np.full((n, max_steps), -1, np.int32)
    success = np.zeros((n,), bool)
    for i in range(n):
        solver = LevelSolver(type(levels)(*(np.asarray(x)[i] for x in levels)), max_steps)
        node = solver.start
        for t in range(max_steps):
            best = solver.best_actions(node)
            if corruption == "state":
                wrong = [a for a in range(4) if a not in best]
                pick = lambda xs, salt: xs[min(int(_unit(node, seed, salt) * len(xs)), len(xs) - 1)]
                a = pick(wrong, 2) if wrong and (not best or _unit(node, seed, 1) < noise) else pick(best or [0, 1, 2, 3], 3)
            else:
                random_step = rng.random() < noise
                a = int(rng.integers(4)) if random_step or not best else int(best[rng.integers(len(best))])
            actions[i, t] = a
            node = _move(node, a, solver.walls, solver.W)
            if solver.solved(node):
                success[i] = True
                break
    return actions, success
