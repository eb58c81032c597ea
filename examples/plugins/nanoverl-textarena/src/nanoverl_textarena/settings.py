"""[environment.textarena]: the adapter's settings, validated by nanoverl like its own keys (textarena is
imported only to check a game id that is set)."""

from typing import Literal

import attrs


def _known_game(instance, attribute, value: str) -> None:
    if value:
        from .game import check_game_id

        check_game_id(value)


@attrs.define
class TextArenaSettings:
    env_id: str = attrs.field(default="", validator=_known_game)
    """The game (a textarena id such as "GuessTheNumber-v0") of rows whose extra_info names none; "": every
    row names its own."""
    action: Literal["text", "last_bracket"] = "text"
    """The move the game gets: "text", the model's turn as it is (the game finds its bracketed move itself,
    the first one, as with any textarena agent); "last_bracket", only the turn's last [...] (for a model
    that thinks aloud before it moves), or the whole turn when it has none."""
    observation: Literal["new", "wrapped"] = "new"
    """What each answer holds: "new", only what the game said since the model's move, one "[GAME] ..."
    line per message (the conversation holds the rest); "wrapped", the string of the game id's own
    textarena wrappers, as textarena hands it to an agent (LLMObservationWrapper repeats the whole
    history every turn, and ActionFormattingWrapper brackets a move that has no brackets)."""
    check_prompt: bool = True
    """The row's prompt must contain the game's first observation, so a row written for another seed,
    textarena version or observation setting fails at the episode's start instead of training on a
    prompt that describes another game."""
