"""textarena's single-player games as nanoverl episodes, played through textarena's own API unchanged.

One `TextArenaEpisode` per episode. It builds the game the data row names with `textarena.make`
(extra_info: `env_id`, `seed`), starts it with `reset(num_players=1, seed=seed)`, and each model turn
calls `step(action)` and `get_observation()` as any textarena agent loop does:

    model turn text --(settings.action)--> game.step(action) --> done?
        not done: the game's new messages, "[GAME] ..." lines, as a user message   (EnvStep.observation)
        done:     textarena's reward for player 0 (its `state.rewards[0]`)         (EnvStep.reward)

The game's first observation is the episode's prompt: `make_data.py` writes it into the data row,
and with `check_prompt` the episode checks that the row's prompt holds it. A move the game rejects is
the model's mistake, answered as textarena answers it ("You attempted an invalid move ... Please
resubmit"), and after as many invalid moves in a row as the game allows (one, in textarena's
single-player games) the game ends with its own penalty; neither is a failure of the environment.
Counter: `invalid_moves` (episode/invalid_moves/mean).

Reproducible per episode, whoever shares the process: textarena seeds and draws from Python's global
`random` (its State calls `random.seed(seed)`, and games such as 2048 and Minesweeper draw from it
after the reset), and a worker process holds many episodes whose steps interleave. So every call into
the game runs on the episode's own copy of that generator (swapped in, then out), and the process's
own `random` state is left as it was. Games drawing from numpy's global generator (Sokoban) are not
covered. The games' own prints (puzzle generators report their attempts) are dropped.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import random
import re
from typing import Any

import textarena as ta                               # imported when a worker process loads the environment
from textarena.envs.registration import ENV_REGISTRY

from nanoverl_core.config import settings_or_defaults
from nanoverl_core.env import EnvStep, Turn

from .settings import TextArenaSettings

BRACKETED = re.compile(r"\[[^\[\]]*\]")


def check_game_id(env_id: str) -> None:
    """A ValueError naming the closest ids unless textarena registers `env_id`."""
    if env_id not in ENV_REGISTRY:
        close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=3)
        hint = f"closest: {', '.join(close)}" if close else "textarena.envs.registration.ENV_REGISTRY lists them"
        raise ValueError(f"textarena has no game {env_id!r} ({hint})")


def one_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message that says something (nltk's begin with stars)."""
    lines = [line.strip() for line in str(exc).splitlines() if any(c.isalnum() for c in line)]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def to_action(text: str, how: str) -> str:
    """The move the game gets for a model turn (see TextArenaSettings.action)."""
    if how == "last_bracket":
        moves = BRACKETED.findall(text)
        return moves[-1] if moves else text
    return text


def format_messages(messages: list[tuple[int, str, Any]], role_mapping: dict[int, str]) -> str:
    """textarena's (sender, message, type) triples as its LLMObservationWrapper writes them, one
    "[sender] message" line each, without the model's own moves echoed back (the conversation has them)."""
    return "\n".join(f"[{'GAME' if sender == ta.GAME_ID else role_mapping.get(sender, f'Player {sender}')}] {message}"
                     for sender, message, kind in messages if kind != ta.ObservationType.PLAYER_ACTION)


def prompt_text(prompt: str | list[dict[str, Any]]) -> str:
    """A data row's prompt as text: the string, or its messages' contents."""
    return prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)


class TextArenaEpisode:
    """One game: the nanoverl `Environment` (step, close) over a textarena env (see the module docstring)."""

    def __init__(self, env_id: str, seed: int, settings: TextArenaSettings):
        check_game_id(env_id)
        self.env_id, self.seed, self.settings = env_id, seed, settings
        self._random = random.Random(seed).getstate()
        """The episode's own state of Python's global generator, which textarena draws from."""
        with self._own_random():
            try:
                game = ta.make(env_id)
            except Exception as exc:                # a game textarena cannot build here (see make_data.py)
                raise ValueError(f"textarena could not build {env_id!r}: {one_line(exc)}") from None
            if settings.observation == "new":       # the game itself: its observations are lists of messages
                while isinstance(game, ta.Wrapper):
                    game = game.env
            self.game = game
            try:
                game.reset(num_players=1, seed=seed)
            except Exception as exc:
                raise ValueError(f"textarena's {env_id!r} does not start for one player ({one_line(exc)}); this "
                                 "adapter plays textarena's single-player games") from None
            if not isinstance(game.state, ta.SinglePlayerState):
                raise ValueError(f"textarena's {env_id!r} is a {game.state.num_players}-player game "
                                 f"({type(game.state).__name__}); this adapter plays textarena's single-player games")
            self.first_observation = self._observe()
        """What the game shows before the first move: the prompt of the episode."""

    @contextlib.contextmanager
    def _own_random(self):
        outer = random.getstate()
        random.setstate(self._random)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def _observe(self) -> str:
        _, observation = self.game.get_observation()
        if isinstance(observation, str):            # a textarena observation wrapper's rendering
            return observation.strip()
        return format_messages(observation, self.game.state.role_mapping)

    def step(self, turn: Turn) -> EnvStep:
        with self._own_random():
            done, _ = self.game.step(to_action(turn.text, self.settings.action))
            state = self.game.state
            if done:
                invalid = bool(state.game_info[0].get("invalid_move"))
                return EnvStep(reward=float((state.rewards or {}).get(0, 0.0)), done=True,
                               info={"invalid_moves": float(invalid)})
            invalid = state.error_count > 0         # reset to 0 by a valid move (SinglePlayerState.step)
            return EnvStep(observation=[{"role": "user", "content": self._observe()}],
                           info={"invalid_moves": float(invalid)})

    def close(self) -> None:
        with self._own_random():
            self.game.close()


def textarena_episode(sample: dict[str, Any], settings: TextArenaSettings | None = None) -> TextArenaEpisode:
    """The `register_environments` factory: the game and seed of the row's extra_info (env_id, seed)."""
    settings = settings_or_defaults(settings, TextArenaSettings)
    extra = sample.get("extra_info") or {}
    env_id, seed = extra.get("env_id") or settings.env_id, extra.get("seed")
    if not env_id:
        raise ValueError("the data row names no game: give it extra_info.env_id (make_data.py writes it), or set "
                         "environment.textarena.env_id")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"the data row's extra_info.seed must be an integer (the game's seed), not {seed!r}")
    episode = TextArenaEpisode(env_id, seed, settings)
    if settings.check_prompt and episode.first_observation not in prompt_text(sample.get("prompt", "")):
        raise ValueError(f"the row's prompt does not hold the first observation of {env_id!r} for seed {seed}, so it "
                         "describes another game: rewrite the rows with make_data.py for this textarena version "
                         "and environment.textarena.observation, or set environment.textarena.check_prompt=false")
    return episode
