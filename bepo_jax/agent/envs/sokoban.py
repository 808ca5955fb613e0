"""Sokoban as in the paper's visual-Sokoban setting: small rooms (6x6 with the outer
wall), 1-2 boxes, sparse success reward, optional step penalty — in pure JAX.

Levels come from an offline generator (``generate_levels``, NumPy, seeded): carve a
random connected room, put the boxes on targets, then play the game *backwards*
(the player pulls boxes), so every level is solvable by construction. A level is a
set of arrays; ``reset(level)`` gives the same start state to every trajectory of a
group, and ``step(state, action)`` is a pure function (jit/vmap it).

Cells of ``SokobanState.grid`` (int8): 0 wall, 1 floor, 2 target, 3 box, 4 box on
target, 5 player, 6 player on target. Actions: 0 up, 1 down, 2 left, 3 right.
Reward: ``success_reward`` (10) on the step that puts the last box on a target, plus
``step_penalty`` (0 by default, <= 0) on every step.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ...credit.configs import check_int, check_range
from .sokoban_solver import MOVES, demonstrations

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)
SYMBOLS = {WALL: "#", FLOOR: "_", TARGET: "O", BOX: "X", BOX_ON_TARGET: "√", PLAYER: "P", PLAYER_ON_TARGET: "S"}
ACTIONS = ("up", "down", "left", "right")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SokobanConfig:
    """size: room side including the outer wall (6). num_boxes: (min, max) boxes per level
    ((1, 2)). reverse_steps: backward moves that scramble a level (30). max_steps: episode
    time limit (10). success_reward (10.0), step_penalty (0.0, <= 0)."""

    size: int = 6
    num_boxes: tuple[int, int] = (1, 2)
    reverse_steps: int = 30
    max_steps: int = 10
    success_reward: float = 10.0
    step_penalty: float = 0.0

    def __post_init__(self):
        n = "SokobanConfig"
        check_int(n, "size", self.size, lo=4)
        check_int(n, "reverse_steps", self.reverse_steps, lo=1)
        check_int(n, "max_steps", self.max_steps, lo=1)
        lo, hi = self.num_boxes
        if not 1 <= lo <= hi:
            raise ValueError(f"SokobanConfig.num_boxes={self.num_boxes} must be (min, max) with 1 <= min <= max.")
        check_range(n, "success_reward", self.success_reward)
        check_range(n, "step_penalty", self.step_penalty, hi=0.0)


class Level(NamedTuple):
    """A batch of levels: walls, targets, boxes bool [..., H, W]; player int32 [..., 2]."""

    walls: Bool[Array, "... H W"]
    targets: Bool[Array, "... H W"]
    boxes: Bool[Array, "... H W"]
    player: Int[Array, "... 2"]


class SokobanState(NamedTuple):
    walls: Bool[Array, "H W"]
    targets: Bool[Array, "H W"]
    boxes: Bool[Array, "H W"]
    player: Int[Array, "2"]
    t: Int[Array, ""]
    done: Bool[Array, ""]
    success: Bool[Array, ""]

    @property
    def grid(self) -> Int[Array, "H W"]:
        return grid_of(self.walls, self.targets, self.boxes, self.player)


def grid_of(walls, targets, boxes, player):
    """The int8 cell codes (module docstring) of one state."""
    H, W = walls.shape
    g = jnp.where(walls, WALL, jnp.where(targets, TARGET, FLOOR))
    g = jnp.where(boxes, jnp.where(targets, BOX_ON_TARGET, BOX), g)
    at = (jnp.arange(H)[:, None] == player[0]) & (jnp.arange(W)[None, :] == player[1])
    g = jnp.where(at, jnp.where(targets, PLAYER_ON_TARGET, PLAYER), g)
    return g.astype(jnp.int8)


# ------------------------------------------------------------------------------ dynamics


def reset(level: Level) -> SokobanState:
    """The start state of one level (identical for every trajectory of a group)."""
    return SokobanState(jnp.asarray(level.walls), jnp.asarray(level.targets), jnp.asarray(level.boxes),
                        jnp.asarray(level.player, jnp.int32), jnp.int32(0), jnp.bool_(False), jnp.bool_(False))


def step(state: SokobanState, action, config: SokobanConfig = SokobanConfig()):
    """One move: walk, or push a box that has a free cell behind it. Returns
    (state, reward, done). After ``done`` the state is frozen and the reward 0."""
    H, W = state.walls.shape
    move = jnp.asarray(MOVES)[jnp.clip(action, 0, 3)]
    nxt = state.player + move
    beyond = nxt + move

    def at(grid, pos):
        inside = (pos[0] >= 0) & (pos[0] < H) & (pos[1] >= 0) & (pos[1] < W)
        return jnp.where(inside, grid[jnp.clip(pos[0], 0, H - 1), jnp.clip(pos[1], 0, W - 1)], True)

    wall_next = at(state.walls, nxt)
    box_next = at(state.boxes, nxt) & ~wall_next
    blocked_beyond = at(state.walls, beyond) | at(state.boxes, beyond)
    can_walk = ~wall_next & ~box_next
    can_push = box_next & ~blocked_beyond
    moved = (can_walk | can_push) & ~state.done
    boxes = state.boxes
    pushed = moved & can_push
    boxes = jnp.where(pushed, boxes.at[nxt[0], nxt[1]].set(False).at[beyond[0], beyond[1]].set(True), boxes)
    player = jnp.where(moved, nxt, state.player)
    solved = jnp.all(jnp.where(boxes, state.targets, True))
    success = ~state.done & solved
    t = state.t + jnp.where(state.done, 0, 1)
    done = state.done | solved | (t >= config.max_steps)
    reward = jnp.where(state.done, 0.0, jnp.where(success, config.success_reward, 0.0) + config.step_penalty)
    new = SokobanState(state.walls, state.targets, boxes, player.astype(jnp.int32), t, done, state.success | success)
    return new, reward.astype(jnp.float32), done


# ------------------------------------------------------------------------------ levels


_STEPS = [tuple(int(v) for v in m) for m in MOVES]  # the moves as Python ints (the generators' inner loops)


def _carve_room(rng: np.random.Generator, size: int) -> np.ndarray:
    """A random connected floor region inside the outer wall (a random walk carves it).

    Plain Python integers in the loop (NumPy's clip and sum per step were most of the
    generator's time); the random draws are the same calls in the same order as before, so
    every seed gives the levels it always gave (tests/agent/test_sokoban.py pins them)."""
    walls = np.ones((size, size), bool)
    r, c = (int(v) for v in rng.integers(1, size - 1, 2))
    walls[r, c] = False
    floor, target_floor, hi = 1, int(0.6 * (size - 2) ** 2) + 1, size - 2
    while floor < target_floor:
        dr, dc = _STEPS[rng.integers(4)]
        r, c = min(max(r + dr, 1), hi), min(max(c + dc, 1), hi)
        if walls[r, c]:
            walls[r, c] = False
            floor += 1
    return walls


def _reverse_play(rng, walls, targets, player, boxes, steps):
    """Play backwards: the player moves, pulling a box that sits behind it."""
    r, c = int(player[0]), int(player[1])
    for _ in range(steps):
        dr, dc = _STEPS[rng.integers(4)]
        if walls[r + dr, c + dc] or boxes[r + dr, c + dc]:
            continue
        if boxes[r - dr, c - dc] and rng.random() < 0.8:
            boxes[r - dr, c - dc] = False
            boxes[r, c] = True
        r, c = r + dr, c + dc
    return np.array([r, c]), boxes


def generate_levels(n: int, *, config: SokobanConfig = SokobanConfig(), seed: int = 0) -> Level:
    """``n`` solvable levels (stacked arrays), deterministic in ``seed``. Levels that the
    backward play left already solved are drawn again."""
    rng = np.random.default_rng(seed)
    S = config.size
    out = {k: [] for k in ("walls", "targets", "boxes", "player")}
    while len(out["player"]) < n:
        walls = _carve_room(rng, S)
        floor = np.argwhere(~walls)
        k = int(rng.integers(config.num_boxes[0], config.num_boxes[1] + 1))
        if len(floor) < k + 2:
            continue
        picks = floor[rng.permutation(len(floor))[: k + 1]]
        targets = np.zeros_like(walls)
        targets[tuple(picks[:k].T)] = True
        boxes = targets.copy()
        player, boxes = _reverse_play(rng, walls, targets, picks[k].copy(), boxes, config.reverse_steps)
        if (boxes == targets).all():
            continue  # nothing to solve
        out["walls"].append(walls)
        out["targets"].append(targets)
        out["boxes"].append(boxes)
        out["player"].append(np.asarray(player, np.int32))
    return Level(*(np.stack(out[k]) for k in ("walls", "targets", "boxes", "player")))


def level_at(levels: Level, i) -> Level:
    return Level(*(x[i] for x in levels))


def render_text(grid) -> str:
    """The text observation of a grid (rows of symbols: # wall, _ floor, O target,
    X box, √ box on target, P player, S player on target)."""
    g = np.asarray(grid)
    return "\n".join("".join(SYMBOLS[int(v)] for v in row) for row in g)


# ------------------------------------------------------------------------------ the JaxEnv


class SokobanEnv:
    """Sokoban behind the ``JaxEnv`` interface (``bepo_jax.agent.envs.base``): tasks are
    ``Level``s from the offline generator, the observation is the grid, rendered as text
    rows (``render_text``). ``held_out_seed`` offsets evaluation levels from training ones."""

    name = "sokoban"
    action_words = ACTIONS
    # the task as a chat model reads it (``agent.rollouts.chat``): the goal and the map's symbols
    objective = ("Push every box onto a target. The map, row by row: # wall, _ floor, O target, X box, "
                 "√ box on a target, P you, S you on a target. You move up, down, left or right and push a box "
                 "by walking into it.")

    def __init__(self, config: SokobanConfig = SokobanConfig()):
        from .base import NEWLINE, symbol_table

        self.config = config
        self.max_steps = config.max_steps
        self.obs_len = config.size * (config.size + 1)
        self.noop_reward = config.step_penalty
        self._symbols = symbol_table([SYMBOLS[c] for c in range(7)])
        self._newline = NEWLINE

    def sample_tasks(self, n: int, seed: int) -> Level:
        return generate_levels(n, config=self.config, seed=seed)

    def task_signatures(self, tasks: Level) -> list[str]:
        """Each level's content digest (walls, targets, boxes, player): equal iff the levels are
        the same puzzle (``envs.pools``, which keeps evaluation pools disjoint from training pools)."""
        from .pools import digest

        walls, targets, boxes, player = (np.asarray(x) for x in tasks)
        return [digest(walls[i], targets[i], boxes[i], player[i]) for i in range(len(player))]

    def reset(self, task: Level) -> SokobanState:
        return reset(task)

    def step(self, inner: SokobanState, action):
        new, reward, _ = step(inner, action, self.config)
        solved = new.success & ~inner.success
        return new, reward, solved, solved

    def demonstrations(self, tasks: Level, *, noise: float, seed: int, corruption: str = "step"):
        """A noisy shortest-path expert's episode on each level: actions int32 [N, max_steps]
        (-1 after it ends); ``noise`` is the share of corrupted decisions, ``corruption`` "step"
        (random actions) or "state" (fixed mistakes at a share of the states)
        (``envs.sokoban_solver.demonstrations``). What ``bepo-jax sft`` clones into a warm start."""
        return demonstrations(tasks, max_steps=self.max_steps, noise=noise, seed=seed, corruption=corruption)[0]

    def canonical(self, inner: SokobanState) -> SokobanState:
        """The state without its clock (for ``bepo_jax.lab.enumerate_states``): the
        inner ``t`` and a time-limit ``done`` do not change the dynamics or the view."""
        return inner._replace(t=jnp.zeros_like(inner.t), done=inner.success)

    def render(self, inner: SokobanState):
        from .base import grid_to_tokens

        return grid_to_tokens(inner.grid, jnp.asarray(self._symbols), self._newline)

    def observation(self, inner: SokobanState):
        return inner.grid
