"""Guess the digit: a tiny game written with OpenEnv's own API (Action / Observation / State models, an
Environment subclass, and the server app `create_app` builds), as an environment author would write it.

reset(seed, max_guesses) draws the secret digit from the seed; each step reads the guess and answers "+"
(higher) or "-" (lower), reward 0.1 for a digit, "=" (right: reward 1, done) or "?" (not a digit: 0); the
episode is over after max_guesses guesses. Everything it says is in the debug tokenizer's alphabet.

For the tests, driven by environment variables (read in whichever process runs the game: an environment
worker, or the server):
    GUESS_LOG          append one JSON line per step: what the game saw and answered, and its pid
    GUESS_DIE_AFTER    with GUESS_DIE_MARK: the process's Nth step SIGKILLs its own process (the server), once
                       for all processes (the mark file says it happened)
A guess containing "!" raises; one containing "~" sleeps 30 s (a hung server). Neither character is in the
debug tokenizer's alphabet, so only the unit tests send them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from typing import Any, Optional

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

STEPS = [0]
"""Steps taken in this process (GUESS_DIE_AFTER)."""


class GuessAction(Action):
    guess: str = Field(..., description="the guess: one digit")


class GuessObservation(Observation):
    hint: str = Field(default="", description="'+' higher, '-' lower, '=' right, '?' not a digit")


class GuessState(State):
    secret: int = 0
    seed: Optional[int] = None
    max_guesses: int = 3


class GuessNumberEnv(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, max_guesses: int = 3,
              **kwargs: Any) -> GuessObservation:
        secret = random.Random(seed).randrange(10)
        self._state = GuessState(episode_id=episode_id or uuid.uuid4().hex, secret=secret, seed=seed,
                                 max_guesses=max_guesses)
        return GuessObservation(hint=f"{max_guesses}?")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        text = action.guess
        if "!" in text:
            raise ValueError(f"the guess {text!r} blew up")
        if "~" in text:
            time.sleep(30)
        state = self._state
        state.step_count += 1
        guess = text.strip()
        hint = "?" if not guess.isdigit() else "=" if int(guess) == state.secret else \
            "+" if int(guess) < state.secret else "-"
        reward = {"=": 1.0, "+": 0.1, "-": 0.1}.get(hint, 0.0)
        done = hint == "=" or state.step_count >= state.max_guesses
        _log(episode=state.episode_id, seed=state.seed, turn=state.step_count - 1, text=text, hint=hint,
             reward=reward, done=done, pid=os.getpid())
        _maybe_die()
        return GuessObservation(hint=hint, reward=reward, done=done)

    @property
    def state(self) -> GuessState:
        return self._state


def _log(**record: Any) -> None:
    path = os.environ.get("GUESS_LOG")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())   # one write: whole lines from every process
        finally:
            os.close(fd)


def _maybe_die() -> None:
    STEPS[0] += 1
    after, mark = os.environ.get("GUESS_DIE_AFTER"), os.environ.get("GUESS_DIE_MARK")
    if after and mark and STEPS[0] >= int(after):
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL))     # the first to get here dies, once
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


app = create_app(GuessNumberEnv, GuessAction, GuessObservation, env_name="guess_number", max_concurrent_envs=64)


class RaisingEnv(GuessNumberEnv):
    """The game with a bug: every step raises."""

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        raise KeyError("no step today")


# ---- environments the adapter must refuse, with one line -------------------------------------------------
class TwoTextsAction(Action):
    left: str = ""
    right: str = ""


class TwoTextsEnv(Environment):
    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        return GuessObservation()

    def step(self, action: TwoTextsAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        return GuessObservation()

    @property
    def state(self) -> State:
        return State()


class UnsaidEnv(Environment):
    def reset(self, seed=None, episode_id=None, **kwargs):
        return GuessObservation()

    def step(self, action, timeout_s=None, **kwargs):
        return GuessObservation()

    @property
    def state(self):
        return State()


class NotAnEnvironment:
    pass


def first_digit(text: str) -> dict[str, str]:
    """An action function: the turn's first digit is the guess (the rest is the model thinking aloud)."""
    digits = [c for c in text if c.isdigit()]
    return {"guess": digits[0] if digits else text}


def hint_and_count(fields: dict[str, Any]) -> str:
    """An observation function: the hint, twice."""
    return fields["hint"] * 2
