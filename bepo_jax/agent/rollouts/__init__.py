"""The rollouts: how a policy plays a group of episodes and what it records (``StepBatch`` plus the
tokens, masks and log-probs the update needs, as a ``Rollout``).

- ``jitted``: the character policy on a JAX environment, the whole episode under ``jax.jit``
  (``make_rollout``), and the prompt layout every token rollout shares;
- ``host``: the same policy on a Python environment (TextWorld, or a JAX environment stepped on the
  host), the policy calls batched and jitted, the environment stepped in Python (``make_host_rollout``);
- ``chat``: a pretrained model through its chat template (``ChatRollout``), with its KV caches carried
  from turn to turn;
- ``memory``: the C allocator's freed memory given back to the system between turns and phases.
"""

from .chat import ChatRollout, ChatRolloutConfig
from .host import JaxEnvOnHost, make_host_rollout
from .jitted import Rollout, RolloutConfig, make_replay, make_rollout, prompt_length

__all__ = ["ChatRollout", "ChatRolloutConfig", "JaxEnvOnHost", "Rollout", "RolloutConfig", "make_host_rollout",
           "make_replay", "make_rollout", "prompt_length"]
