"""The adapter in-process, on the fixture game written with OpenEnv's API: the mapping of turns and
observations, the row's reset arguments, the game's own failures; no trainer."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from conftest import GAME
from nanoverl_core import ConfigError
from nanoverl_core.env import EnvStep, Turn
from nanoverl_openenv.episode import openenv_episode
from nanoverl_openenv.mapping import SettingError, mapping_for, text_fields
from nanoverl_openenv.settings import OpenEnvSettings


def settings(**kw) -> OpenEnvSettings:
    return OpenEnvSettings(**{"env": f"{GAME}:GuessNumberEnv", **kw})


def turn(text: str, index: int = 0) -> Turn:
    return Turn(text, (), index)


def secret(seed: int) -> int:
    return random.Random(seed).randrange(10)


def hint(guess: int, seed: int) -> str:
    return "=" if guess == secret(seed) else "+" if guess < secret(seed) else "-"


def test_a_turn_is_the_actions_text_field_and_the_hint_comes_back_as_a_user_message():
    episode = openenv_episode({"prompt": "4:3?", "reset": {"seed": 4}}, settings())
    wrong = (secret(4) + 1) % 10
    assert episode.step(turn(str(wrong))) == EnvStep(observation=[{"role": "user", "content": hint(wrong, 4)}],
                                                     reward=0.1)
    assert episode.step(turn(" x ", 1)) == EnvStep(observation=[{"role": "user", "content": "?"}])
    right = episode.step(turn(str(secret(4)), 2))
    assert (right.reward, right.done) == (1.0, True)
    assert episode.env.state.step_count == 3 and episode.env.state.secret == secret(4)   # the game object itself
    episode.close()


def test_the_rows_reset_field_reaches_reset_and_none_values_are_dropped():
    row = {"prompt": "9:2?", "reset": {"seed": 9, "max_guesses": 2, "unused_by_this_row": None}}
    episode = openenv_episode(row, settings(role=""))
    assert episode.first == {"observation": {"hint": "2?", "metadata": {}}, "reward": None, "done": False}
    wrong = (secret(9) + 1) % 10
    assert episode.step(turn(str(wrong))) == EnvStep(observation=hint(wrong, 9), reward=0.1)
    assert episode.step(turn(str(wrong), 1)).done                       # max_guesses = 2 from the row
    other = openenv_episode({"prompt": "?", "custom": {"seed": 9}}, settings(reset_key="custom"))
    assert other.env.state.seed == 9 and other.env.state.max_guesses == 3
    bare = openenv_episode({"prompt": "?"}, settings())                  # no reset field: reset()
    assert bare.env.state.seed is None
    with pytest.raises(ValueError, match="'reset' must be a dict of reset's keyword arguments"):
        openenv_episode({"prompt": "?", "reset": 3}, settings())


def test_action_and_observation_functions_and_a_named_field():
    s = secret(1)
    episode = openenv_episode({"reset": {"seed": 1}}, settings(action=f"{GAME}:first_digit",
                                                               observation=f"{GAME}:hint_and_count", role=""))
    assert episode.step(turn(f"I think {s}, or 3")) == EnvStep(observation="==", reward=1.0, done=True)
    named = openenv_episode({"reset": {"seed": 1}}, settings(observation="hint", role="tool"))
    assert named.step(turn(str(s))).observation == [{"role": "tool", "content": "="}]


def test_check_prompt_refuses_a_row_written_for_another_episode():
    openenv_episode({"prompt": "1:2?", "reset": {"seed": 1, "max_guesses": 2}}, settings(check_prompt=True))
    with pytest.raises(ValueError, match="does not contain the reset observation '3\\?'"):
        openenv_episode({"prompt": "1:2?", "reset": {"seed": 1}}, settings(check_prompt=True))


def test_an_environment_that_raises_raises_in_the_call():
    """nanoverl's worker turns it into the episode's failure (environment.on_error)."""
    episode = openenv_episode({"reset": {"seed": 0}}, settings())
    with pytest.raises(ValueError, match="the guess '!' blew up"):
        episode.step(turn("!"))


def test_the_default_mapping_needs_one_text_field_else_a_setting_names_the_way():
    def plain(**kw):                                    # mapping_for reads these three settings
        return SimpleNamespace(**{"action": "", "observation": "", "role": "user", **kw})

    action = {"title": "A", "properties": {"metadata": {"type": "object"}, "left": {"type": "string"},
                                           "right": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
    observation = {"properties": {"done": {"type": "boolean"}, "hint": {"type": "string"}}}
    assert text_fields(action) == ["left", "right"]
    with pytest.raises(ValueError, match="its action A has 2 text fields .*set environment.openenv.action"):
        mapping_for(plain(), action, observation)
    one = {"properties": {"n": {"type": "integer"}, "text": {"type": "string"}}, "required": ["n", "text"]}
    with pytest.raises(ValueError, match="required n"):
        mapping_for(plain(), one, observation)
    text = {"properties": {"text": {"type": "string"}}}
    fine = mapping_for(plain(), text, observation)
    assert fine.action("hi") == {"text": "hi"} and fine.text({"hint": "+"}) == "+"
    with pytest.raises(SettingError, match="its observation has no field 'hnit'") as err:
        mapping_for(plain(observation="hnit"), text, observation)
    assert err.value.setting == "observation"
    with pytest.raises(ConfigError, match="config key 'environment.openenv.observation': its observation has no "
                                          "field 'hnit'"):
        settings(observation="hnit")                   # checked against the game's Observation when built
