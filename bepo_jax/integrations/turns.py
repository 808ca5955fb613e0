"""Multi-turn conversations -> step credit -> per-token advantages (trainer-neutral).

A multi-turn agent trainer (Tunix's agentic learner, or any other) keeps each trajectory
as one token stream after the prompt: turn t's assistant tokens, then the environment's
reply to it, then turn t + 1's assistant tokens, ... with a mask that is 1 on assistant
tokens and 0 on environment tokens. This module turns a group of such trajectories into
the estimators' StepBatch and their per-step advantages back into that stream:

    Turn(state, reward, assistant_tokens, env_tokens)      one per turn t of a trajectory
    group_step_advantages(turns, outcomes, name, config)   -> A[k][t] per trajectory, + diagnostics
    token_advantages(turns, A, mask)                        -> float32 [K, L]:
        adv[k, p] = A[k][t] for the p in turn t's assistant span, 0 on environment and padding

A turn's ``state`` is the observation the model acted on (a string: equal strings are the
same state of the empirical graph); ``reward`` its step reward. Spans are laid out in
order -- assistant_tokens of turn 0, env_tokens of turn 0, assistant_tokens of turn 1, ... --
and cut at the stream's padded length L.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from ..estimators.registry import compute_advantages
from ..types import FAILURE, SUCCESS, TRUNCATED
from .rows import from_rows, to_rows


class Turn(NamedTuple):
    """One turn of a trajectory: the observation acted on, the step reward, and how many
    assistant and environment tokens the turn adds to the token stream."""

    state: str
    reward: float
    assistant_tokens: int
    env_tokens: int


def outcome_code(ended_by_env: bool, total_reward: float) -> int:
    """SUCCESS if the environment ended the episode with a positive total reward, FAILURE
    if it ended it otherwise, TRUNCATED if something else stopped it (step or token limit,
    a timeout)."""
    if not ended_by_env:
        return TRUNCATED
    return SUCCESS if total_reward > 0 else FAILURE


def group_step_advantages(turns: Sequence[Sequence[Turn]], outcomes: Sequence[int], estimator: str,
                          config=None, *, totals: Optional[Sequence[float]] = None
                          ) -> tuple[list[np.ndarray], dict]:
    """Per-turn advantages of one group (K trajectories sampled from one task).

    ``totals`` (optional): each trajectory's total reward as the trainer scored it; the
    difference from the sum of its turn rewards is added to its last turn (so a reward
    computed over the whole trajectory lands where the trajectory ends). Returns one
    float32 array of length len(turns[k]) per trajectory (empty for a trajectory with no
    turn) and the estimator's diagnostics as floats (``states``, ``gated_share``,
    ``converged``, ``iterations`` where the estimator builds the state graph).

    A trajectory without turns (e.g. its first reply used the whole token budget) has no
    record and takes no part; when fewer than two trajectories have turns there is
    nothing to compare and every advantage is 0 (diagnostics empty)."""
    K = len(turns)
    if len(outcomes) != K:
        raise ValueError(f"group_step_advantages: {K} trajectories but {len(outcomes)} outcomes; "
                         "give one per trajectory.")
    if totals is not None and len(totals) != K:
        raise ValueError(f"group_step_advantages: {K} trajectories but {len(totals)} totals; give one per trajectory.")
    uid, traj, step, obs, reward, outcome = [], [], [], [], [], []
    for k, tr in enumerate(turns):
        r = [float(t.reward) for t in tr]
        if totals is not None and r:
            r[-1] += float(totals[k]) - float(np.sum(r))
        for i, t in enumerate(tr):
            if not isinstance(t.state, str):
                raise ValueError(f"Turn.state must be a string (the observation text), got {type(t.state).__name__} "
                                 f"in trajectory {k}, turn {i}.")
            uid.append(0)
            traj.append(k)
            step.append(i)
            obs.append(t.state)
            reward.append(r[i])
            outcome.append(int(outcomes[k]))
    if sum(len(tr) > 0 for tr in turns) < 2:
        return [np.zeros(len(tr), np.float32) for tr in turns], {}
    batch, index = from_rows(uid, traj, step, obs, np.asarray(reward, np.float32), np.asarray(outcome, np.int32))
    out = compute_advantages(estimator, batch, config)  # validates config (a dict or an instance)
    per_row = to_rows(out.advantage, index)
    result, at = [], 0
    for tr in turns:
        result.append(np.asarray(per_row[at: at + len(tr)], np.float32))
        at += len(tr)
    diag = getattr(out, "diagnostics", None)
    info = {}
    if diag is not None:
        info = {"states": float(np.asarray(diag.num_states)[0]), "gated_share": float(np.asarray(diag.gated_share)[0]),
                "converged": float(np.asarray(diag.converged)[0]), "iterations": float(np.asarray(diag.iterations)[0])}
    return result, info


def token_advantages(turns: Sequence[Sequence[Turn]], step_advantages: Sequence[np.ndarray], mask) -> np.ndarray:
    """Lay per-turn advantages onto the token stream: float32 [K, L] with L = mask's width.

    ``mask`` [K, L]: the trainer's completion mask (1 on assistant tokens); the result is
    zero wherever it is zero. A turn's assistant span that the mask does not cover (the
    stream was cut at L, or the trainer zeroed a filtered trajectory) gets no credit there."""
    mask = np.asarray(mask)
    K, L = mask.shape
    if len(turns) != K or len(step_advantages) != K:
        raise ValueError(f"token_advantages: mask has {K} rows but {len(turns)} trajectories and "
                         f"{len(step_advantages)} advantage arrays; give one per trajectory.")
    adv = np.zeros((K, L), np.float32)
    for k, (tr, a) in enumerate(zip(turns, step_advantages)):
        if len(a) != len(tr):
            raise ValueError(f"token_advantages: trajectory {k} has {len(tr)} turns but {len(a)} advantages.")
        p = 0
        for t, v in zip(tr, a):
            adv[k, p: min(p + int(t.assistant_tokens), L)] = v
            p += int(t.assistant_tokens) + int(t.env_tokens)
    return adv * (mask != 0)
