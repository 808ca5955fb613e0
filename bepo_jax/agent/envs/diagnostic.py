"""Small diagnostic environments, each isolating one credit pattern the paper names.

Every world is a ``GraphWorld``: hidden states 0..N-1, a view (observation text) per
state — two states may share one, which is aliasing — and a transition table. Success
pays 1, so with the lab's default gamma = 1 the exact value V^pi is the success
probability within the time limit. Each is a ``JaxEnv`` (one task; ``reset`` is the
start state, ``observation`` the view's id, ``render`` its text), so the ordinary
rollouts can drive the deterministic ones; ``slippery`` is stochastic and is sampled
through ``bepo_jax.lab`` (``branches``), since a ``JaxEnv.step`` has no random key.

What a perfect estimator does in each (A^pi = the exact advantage of the step):

- ``key_door``: taking the key is useful (A^pi > 0) also in the runs that later fall
  off the bridge and fail; outcome credit (GRPO) punishes it there.
- ``bump``: bumping into the wall wastes one of the few steps (A^pi < 0) also in the
  runs that still reach the goal; outcome credit rewards it there.
- ``aliased``: two rooms look the same; one holds the goal (behind "left"), the other
  is a dead end. Merging on the view alone pools their values, so the choice at the
  fork that leads to the good room loses its credit; merging on the last two views
  (``history=1``) tells the rooms apart.
- ``loop``: stepping back returns to an earlier state (a loop) and one wrong step
  traps the agent for good; looping and trapping steps have A^pi < 0, forward steps > 0.
- ``slippery``: "run" skips a cell but slips back to the start half of the time; the
  perfect credit is the expected advantage of the action, not the luck of the draw.
- ``decisions``: a fixed horizon of which a share (the *decision density*) are decisions
  (one action keeps the agent on track, the other loses the episode) and the rest routine
  (the action changes nothing, A^pi = 0); a lost decision shows at once (``visible``: the
  gate sees two successors there) or only at the end (hidden: the views alias and the gate
  stays closed). The credit lab's diagnostic protocol sweeps both.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from .text import PAD, encode


class GraphWorld:
    """A tabular ``JaxEnv`` (module docstring). ``next_state`` int [N, A] (or [N, A, M]
    with ``prob`` [N, A, M] for stochastic steps), ``reward``/``success``/``terminal`` of
    the same shape, ``views[s]`` the observation text of state s; start = state 0."""

    noop_reward = 0.0

    def __init__(self, name: str, *, action_words: Sequence[str], views: Sequence[str], next_state,
                 reward=None, success=None, terminal=None, prob=None, max_steps: int):
        nxt = np.asarray(next_state, np.int32)
        if nxt.ndim == 2:
            nxt = nxt[..., None]
        N, A, M = nxt.shape
        full = lambda x, dt, fill: np.zeros((N, A, M), dt) + fill if x is None else np.asarray(x, dt).reshape(N, A, M)
        self.name = name
        self.action_words = tuple(action_words)
        if len(self.action_words) != A:
            raise ValueError(f"GraphWorld {name}: {len(self.action_words)} action words for {A} actions.")
        if len(views) != N:
            raise ValueError(f"GraphWorld {name}: {len(views)} views for {N} states.")
        self.max_steps = int(max_steps)
        self.tables = dict(next_state=nxt, prob=full(prob, np.float32, 1.0 if prob is None else 0.0),
                           success=full(success, bool, False), terminal=full(terminal, bool, False))
        self.tables["reward"] = full(reward, np.float32, 0.0) if reward is not None else \
            self.tables["success"].astype(np.float32)
        if not np.allclose(self.tables["prob"].sum(-1), 1.0):
            raise ValueError(f"GraphWorld {name}: prob must sum to 1 over the last axis.")
        self.views = tuple(views)
        names = sorted(set(views))
        self.view_id = np.array([names.index(v) for v in views], np.int32)
        width = max(len(v) for v in names)
        self.obs_len = width
        rows = np.full((len(names), width), PAD, np.int32)
        for i, v in enumerate(names):
            rows[i, : len(v)] = encode(v)
        self._rows = rows
        self.stochastic = M > 1

    # ------------------------------------------------------------------ JaxEnv
    def sample_tasks(self, n: int, seed: int = 0):
        return np.zeros((n,), np.int32)  # one task: the start state

    def reset(self, task):
        del task
        return jnp.zeros((), jnp.int32)

    def branches(self, inner, action):
        t = {k: jnp.asarray(v) for k, v in self.tables.items()}
        a = jnp.clip(action, 0, len(self.action_words) - 1)
        return (t["next_state"][inner, a], t["reward"][inner, a], t["success"][inner, a],
                t["terminal"][inner, a] | t["success"][inner, a], t["prob"][inner, a])

    def step(self, inner, action):
        if self.stochastic:
            raise ValueError(f"GraphWorld {self.name!r} has stochastic steps; a JaxEnv step has no random key. "
                             "Sample it with bepo_jax.lab.sample_groups (or credit_quality).")
        nxt, r, s, term, _ = self.branches(inner, action)
        return nxt[0], r[0], s[0], term[0]

    def observation(self, inner):
        return jnp.asarray(self.view_id)[inner][None]

    def render(self, inner):
        return jnp.asarray(self._rows)[jnp.asarray(self.view_id)[inner]]


def key_door() -> GraphWorld:
    """hall -(left: take key)-> hall with key -> door (opens) -> bridge -(right)-> goal;
    hall -(right: no key)-> corridor -> locked door (stuck until the time limit).
    On the bridge "left" falls (terminal failure). Horizon 5 (one spare step)."""
    views = ["hall", "hall key", "corridor", "door key", "door locked", "bridge"]
    nxt = [[1, 2], [3, 3], [4, 4], [5, 5], [4, 4], [5, 5]]
    success = np.zeros((6, 2), bool); success[5, 1] = True
    terminal = np.zeros((6, 2), bool); terminal[5, 0] = True
    return GraphWorld("key_door", action_words=("left", "right"), views=views, next_state=nxt,
                      success=success, terminal=terminal, max_steps=5)


def bump(length: int = 4, spare: int = 2) -> GraphWorld:
    """A corridor of ``length`` cells to the goal; "right" advances, "left" bumps the
    wall and stays. Time limit length + ``spare``: every bump spends a spare step."""
    N = length
    views = [f"cell {i}" for i in range(N)]
    nxt = [[i, min(i + 1, N - 1)] for i in range(N)]
    success = np.zeros((N, 2), bool); success[N - 1, 1] = True
    return GraphWorld("bump", action_words=("left", "right"), views=views, next_state=nxt, success=success,
                      max_steps=length + spare)


def aliased() -> GraphWorld:
    """fork -(left)-> corridor a -> room (hidden L); fork -(right)-> corridor b -> room
    (hidden R). Both rooms show the view "room". In L "left" wins and "right" fails; R
    is a dead end (both fail). So V(L) = 1/2, V(R) = 0 under the uniform policy, the
    merged "room" averages them, and the fork's choice loses its credit; the corridors
    differ, so one step of history (``history=1``) tells the rooms apart."""
    views = ["fork", "corridor a", "corridor b", "room", "room"]
    nxt = [[1, 2], [3, 3], [4, 4], [3, 3], [4, 4]]
    success = np.zeros((5, 2), bool); success[3, 0] = True
    terminal = np.zeros((5, 2), bool); terminal[3, 1] = True; terminal[4, :] = True
    return GraphWorld("aliased", action_words=("left", "right"), views=views, next_state=nxt, success=success,
                      terminal=terminal, max_steps=4)


def loop() -> GraphWorld:
    """A chain start -> a -> b -> goal with "right" (forward) and "left": at the start
    "left" stays, at a it falls into a trap (a state no action leaves), at b it loops
    back to the start. Time limit 6."""
    views = ["start", "room a", "room b", "trap"]
    nxt = [[0, 1], [3, 2], [0, 2], [3, 3]]
    success = np.zeros((4, 2), bool); success[2, 1] = True
    return GraphWorld("loop", action_words=("left", "right"), views=views, next_state=nxt, success=success,
                      max_steps=6)


def slippery(cells: int = 5, slip: float = 0.5) -> GraphWorld:
    """A track of ``cells`` to the goal: "walk" advances one cell; "run" advances two
    but slips back to the start with probability ``slip``. Time limit cells - 1."""
    N = cells - 1  # states 0..N-1; reaching cell N is the goal
    nxt = np.zeros((N, 2, 2), np.int32)
    prob = np.zeros((N, 2, 2), np.float32)
    success = np.zeros((N, 2, 2), bool)
    for i in range(N):
        w = i + 1
        nxt[i, 0] = [min(w, N - 1), min(w, N - 1)]; prob[i, 0] = [1.0, 0.0]; success[i, 0] = w >= N
        r = i + 2
        nxt[i, 1] = [min(r, N - 1), 0]; prob[i, 1] = [1.0 - slip, slip]; success[i, 1, 0] = r >= N
    return GraphWorld("slippery", action_words=("walk", "run"), views=[f"track {i}" for i in range(N)],
                      next_state=nxt, prob=prob, success=success, max_steps=cells - 1)


def decision_steps(horizon: int, density: float) -> list[int]:
    """The decision steps of ``decisions``: n = round(density x horizon) of 0..horizon-1, evenly spaced
    back from the last step (horizon - 1 - round(i horizon / n), i < n)."""
    n = int(round(density * horizon))
    return sorted({horizon - 1 - int(round(i * horizon / n)) for i in range(n)}) if n else []


def decisions(horizon: int = 8, density: float = 0.5, visible: bool = True) -> GraphWorld:
    """Steps 0..horizon-1 along a track; at a decision step (``decision_steps``) the action
    t mod 2 keeps the agent on track and the other puts it off track for good; at a routine
    step either action moves on. The last step pays 1 (success) on track, 0 off track. Off-track
    views read "off t" (``visible``) or the same "t" as on track (hidden: a lost decision shows only
    in the outcome). States: on track 0..H-1, off track H..2H-1."""
    H = int(horizon)
    if H < 1 or not 0.0 <= density <= 1.0:
        raise ValueError(f"decisions: horizon={horizon} must be >= 1 and density={density} in [0, 1].")
    D = set(decision_steps(H, density))
    nxt = np.zeros((2 * H, 2), np.int32)
    success = np.zeros((2 * H, 2), bool)
    terminal = np.zeros((2 * H, 2), bool)
    for t in range(H):
        on_next, off_next = (t + 1, H + t + 1) if t + 1 < H else (t, H + t)
        for a in range(2):
            keeps = t not in D or a == t % 2
            nxt[t, a] = on_next if keeps else off_next
            nxt[H + t, a] = off_next
            if t == H - 1:
                success[t, a] = keeps
                terminal[t, a] = terminal[H + t, a] = True
    views = [f"step {t}" for t in range(H)] + [f"{'off ' if visible else ''}step {t}" for t in range(H)]
    name = f"decisions_d{density:g}_{'visible' if visible else 'hidden'}"
    return GraphWorld(name, action_words=("left", "right"), views=views, next_state=nxt, success=success,
                      terminal=terminal, max_steps=H)


DIAGNOSTIC_ENVS = {"key_door": key_door, "bump": bump, "aliased": aliased, "loop": loop, "slippery": slippery,
                   "decisions": decisions}


def make_diagnostic(name: str, **kwargs) -> GraphWorld:
    if name not in DIAGNOSTIC_ENVS:
        raise ValueError(f"unknown diagnostic environment {name!r}; valid names: {', '.join(DIAGNOSTIC_ENVS)}.")
    return DIAGNOSTIC_ENVS[name](**kwargs)
