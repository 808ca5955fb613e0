"""TextWorld (an ALFWorld-like text game) as a host environment.

Games are generated offline with TextWorld's generator (the library behind ``tw-make``):
``generate_games(n, out_dir, seed=...)`` writes ``n`` small games (rooms, objects and a
quest of ``quest_length`` steps) and returns their paths — no download. One game is one
task; the K trajectories of a group play the same game.

The observation is the room description plus the inventory, normalised to the
tokenizer's alphabet (``text.normalize``) and cut to ``obs_chars`` characters; the
actions are the game's admissible commands (the prompt's task is the quest objective).
Reward 1 on winning (``won``), 0 otherwise; a lost game ends the episode. Requires the
``envs`` extra (``pip install bepo-jax[envs]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .pools import DEFAULT_HELD_OUT, HELD_OUT_POOLS
from .text import normalize

# The shapes a run gives TextWorld: observation and objective characters, admissible commands
# kept and their characters, the episode's step limit (``RunConfig.max_steps`` = 0), the pool.
OBS_CHARS, OBJECTIVE_CHARS, MAX_COMMANDS, COMMAND_CHARS, MAX_STEPS, POOL = 160, 96, 12, 24, 8, 8
# A pretrained model reads the whole text: the limits of ``TextWorldRun.chat_env``.
CHAT_OBS_CHARS, CHAT_OBJECTIVE_CHARS, CHAT_MAX_COMMANDS, CHAT_COMMAND_CHARS = 2000, 1000, 64, 120
SEED_STRIDE = 7919  # a run's games are generated from seed * SEED_STRIDE (held-out: + the eval offset)


def _textworld():
    try:
        import textworld
        import textworld.generator
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError("the TextWorld environment needs textworld: pip install 'bepo-jax[envs]'") from err
    return textworld


def generate_games(n: int, out_dir: str | Path, *, seed: int = 0, rooms: int = 2, objects: int = 3,
                   quest_length: int = 1) -> list[Path]:
    """``n`` compiled games under ``out_dir`` (reused when already there), deterministic in ``seed``."""
    tw = _textworld()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        target = out_dir / f"game_r{rooms}_o{objects}_q{quest_length}_s{seed + i}.z8"
        if not target.exists():
            opt = tw.GameOptions()
            opt.nb_rooms, opt.nb_objects, opt.quest_length = rooms, objects, quest_length
            opt.seeds = seed + i
            opt.path = str(target)
            opt.file_ext = ".z8"
            opt.force_recompile = True
            game = tw.generator.make_game(opt)
            built = Path(tw.generator.compile_game(game, opt))
            if built != target:
                built.replace(target)
                for ext in (".json", ".ni"):
                    side = built.with_suffix(ext)
                    if side.exists():
                        side.replace(target.with_suffix(ext))
        paths.append(target)
    return paths


def game_signature(path: str | Path) -> str:
    """What a generated game is, as content: a digest of its world (the facts of the start state),
    its entities (names, descriptions) and its quest's winning commands, read from the ``.json``
    beside the ``.z8`` — the same for two games that differ only in their seed or the flavour text
    of the objective."""
    import hashlib
    import json

    d = json.loads(Path(path).with_suffix(".json").read_text())
    content = {"world": d.get("world"), "infos": d.get("infos"),
               "quests": [q.get("commands") for q in d.get("quests", [])]}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def game_structure(path: str | Path) -> str:
    """What a generated game is up to its names: a digest of its world's facts (entity ids and
    types, not names) and its quest's winning commands with every entity's name replaced by its id.
    Two games that differ only in what their entities are called ("lock locker with key" and "lock
    safe with passkey" on the same world) have the same structure and different ``game_signature``s."""
    import hashlib
    import json
    import re

    d = json.loads(Path(path).with_suffix(".json").read_text())
    infos = d.get("infos") or []
    items = infos.items() if isinstance(infos, dict) else infos
    names = {v["name"]: k for k, v in items if isinstance(v, dict) and v.get("name")}
    pattern = (re.compile("|".join(rf"\b{re.escape(n)}\b" for n in sorted(names, key=len, reverse=True)))
               if names else None)
    unname = lambda text: pattern.sub(lambda m: f"<{names[m.group(0)]}>", text) if pattern else text
    facts = sorted(json.dumps(f, sort_keys=True) for f in d.get("world") or [])
    quests = [[unname(c) for c in q.get("commands") or []] for q in d.get("quests", [])]
    return hashlib.sha256(json.dumps({"world": facts, "quests": quests}, sort_keys=True).encode()).hexdigest()


def disjoint_games(n: int, out_dir: str | Path, *, seed: int, exclude: set[str], key=game_signature,
                   **kw) -> list[Path]:
    """The first ``n`` games of the sequence from ``seed`` whose ``key`` (``game_signature``: content;
    ``game_structure``: content up to names) is not in ``exclude`` nor repeated among them
    (``pools.first_new``; generated as needed, at most ``pools.MAX_DRAWS`` n tried)."""
    from .pools import MAX_DRAWS, first_new  # read at the call (a test sets MAX_DRAWS)

    tries = MAX_DRAWS * max(n, 1)
    games = (generate_games(1, out_dir, seed=seed + i, **kw)[0] for i in range(tries))
    out = first_new(games, n, key, exclude)
    if len(out) < n:
        raise ValueError(f"disjoint_games: only {len(out)} of {n} games with new content in {tries} seeds from "
                         f"{seed}; the generator's space is too small (raise rooms, objects or quest_length).")
    return out


class TextWorldEnv:
    """One TextWorld game at a time behind the ``HostEnv`` interface."""

    def __init__(self, *, obs_chars: int = OBS_CHARS, objective_chars: int = OBJECTIVE_CHARS,
                 max_commands: int = MAX_COMMANDS, command_chars: int = COMMAND_CHARS):
        self.tw = _textworld()
        self.obs_chars = obs_chars
        self.objective_chars = objective_chars
        self.max_commands = max_commands
        self.command_chars = command_chars
        self._infos = self.tw.EnvInfos(description=True, inventory=True, admissible_commands=True, won=True,
                                       lost=True, objective=True)
        self._env = None
        self._path: Optional[str] = None
        self.objective = ""

    def _commands(self, state) -> list[str]:
        """Admissible commands that fit the word table (at most ``max_commands``, each at most ``command_chars``)."""
        cmds = [normalize(c) for c in (state.admissible_commands or [])]
        return [c for c in cmds if 0 < len(c) <= self.command_chars][: self.max_commands]

    def _observation(self, state) -> str:
        return normalize(f"{state.description or ''} {state.inventory or ''}")[: self.obs_chars]

    def reset(self, task: str | Path) -> tuple[str, list[str]]:
        if self._path != str(task):
            if self._env is not None:
                self._env.close()
            self._env = self.tw.start(str(task), request_infos=self._infos)
            self._path = str(task)
        state = self._env.reset()
        self.objective = normalize(state.objective or "")[: self.objective_chars]
        self._last = state
        return self._observation(state), self._commands(state)

    def step(self, command: str) -> tuple[str, float, bool, bool, list[str]]:
        state, _, done = self._env.step(command)
        won = bool(state.won)
        self._last = state
        return self._observation(state), float(won), bool(done or won or state.lost), won, self._commands(state)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None



class TextWorldRun:
    """TextWorld as a run's host environment (``envs.registry.make_host_env``): the run's
    training games (``task_pool``, default ``POOL``), its held-out games (the first n of one
    seeded sequence whose content differs from every training game's, so a larger evaluation
    extends a smaller one), the episode's shapes and
    the arguments of ``host_rollout.make_host_rollout``. Games are generated into
    ``games_dir`` (default ~/.cache/bepo_jax/textworld) and reused from there."""

    obs_len, word_width, max_commands, task_len = OBS_CHARS, COMMAND_CHARS, MAX_COMMANDS, OBJECTIVE_CHARS

    HELD_OUT = {"structural": game_structure, "disjoint": game_signature, "seeded": None}  # by HELD_OUT_POOLS

    def __init__(self, cfg, games_dir: Optional[Path] = None, *, eval_seed_offset: int,
                 held_out: str = DEFAULT_HELD_OUT):
        if held_out not in HELD_OUT_POOLS:
            raise ValueError(f"held-out games {held_out!r}: choose one of {', '.join(HELD_OUT_POOLS)}.")
        self.held_out_pools = held_out
        self.games_dir = Path(games_dir or Path.home() / ".cache" / "bepo_jax" / "textworld")
        self._kw = dict(rooms=cfg.rooms, objects=cfg.objects, quest_length=cfg.quest_length)
        self._seed = cfg.seed * SEED_STRIDE
        self._held_out_seed = self._seed + eval_seed_offset
        self.pool = cfg.task_pool or POOL
        self.max_steps = cfg.max_steps or MAX_STEPS
        self.train_tasks = [str(p) for p in generate_games(self.pool, self.games_dir, seed=self._seed, **self._kw)]

    def held_out(self, n: int, *, quest_length: Optional[int] = None) -> list[str]:
        """The first ``n`` games of the held-out seed sequence that differ from every training game and
        from each other (``disjoint_games``): in structure (``held_out`` "structural", the default: no
        renamed copy of a training game), in content ("disjoint": runs of 2026-12-04 to 12-06, which keep
        their pools), or not checked ("seeded": the plain sequence, runs before). ``quest_length``: the
        same seeds generated with longer (or shorter) quests than the run's, to test transfer."""
        kw = {**self._kw, **({"quest_length": quest_length} if quest_length else {})}
        key = self.HELD_OUT[self.held_out_pools]
        if key is None:
            return [str(p) for p in generate_games(n, self.games_dir, seed=self._held_out_seed, **kw)]
        train = {key(p) for p in self.train_tasks}
        return [str(p) for p in disjoint_games(n, self.games_dir, seed=self._held_out_seed, exclude=train, key=key,
                                               **kw)]

    def task_signatures(self, games: list[str]) -> list[str]:
        """Each game's content digest (``game_signature``)."""
        return [game_signature(g) for g in games]

    def rollout_args(self) -> dict:
        make = lambda: TextWorldEnv(obs_chars=self.obs_len, objective_chars=self.task_len,
                                    max_commands=self.max_commands, command_chars=self.word_width)
        return dict(make_env=make, max_steps=self.max_steps, obs_len=self.obs_len, word_width=self.word_width,
                    max_commands=self.max_commands, task_len=self.task_len)

    def chat_env(self) -> "TextWorldEnv":
        """One environment for a pretrained model's chat rollouts (``rollouts.chat``): the
        observation, objective and commands as the game gives them (up to generous limits)."""
        return TextWorldEnv(obs_chars=CHAT_OBS_CHARS, objective_chars=CHAT_OBJECTIVE_CHARS,
                            max_commands=CHAT_MAX_COMMANDS, command_chars=CHAT_COMMAND_CHARS)
