"""The adapter against real textarena games: scripted episodes to the game's end, invalid moves,
reproducible episodes that share a process, and the row mistakes that stop an episode's start."""

import random
import re

import pytest

from nanoverl_core.env import EnvStep, Turn
from nanoverl_textarena.game import TextArenaEpisode, textarena_episode, to_action
from nanoverl_textarena.settings import TextArenaSettings

HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]   # 3 disks from A to C in 7 moves


def turns(texts):
    return [Turn(text, (), i) for i, text in enumerate(texts)]


def row(env_id: str, seed: int, prompt=None) -> dict:
    """A data row as make_data.py writes it (the prompt holds the game's first observation)."""
    if prompt is None:
        prompt = [{"role": "user", "content": TextArenaEpisode(env_id, seed, TextArenaSettings()).first_observation}]
    return {"prompt": prompt, "extra_info": {"env_id": env_id, "seed": seed}}


def test_guess_the_number_played_by_bisection_ends_with_reward_one():
    env = textarena_episode(row("GuessTheNumber-v0", 3))
    low, high, steps = 1, 20, []
    for turn in range(10):
        guess = (low + high) // 2
        steps.append(env.step(Turn(f"My guess is [{guess}].", (), turn)))
        if steps[-1].done:
            break
        hint = steps[-1].observation[0]["content"]
        assert re.fullmatch(r"\[GAME\] The target number is (higher|lower)\.", hint)
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    assert steps[-1] == EnvStep(reward=1.0, done=True, info={"invalid_moves": 0.0})
    assert [s.reward for s in steps[:-1]] == [0.0] * (len(steps) - 1) and len(steps) >= 2
    assert guess == env.game.game_number              # the game's secret, found through its own hints
    env.close()


def test_tower_of_hanoi_solved_move_by_move_scores_one_and_shows_each_board():
    env = textarena_episode(row("TowerOfHanoi-v0", 0))
    assert env.first_observation.endswith("Current Board: \nA: [3, 2, 1]\nB: []\nC: []\n.")
    steps = [env.step(turn) for turn in turns(HANOI)]
    assert steps[0].observation == [{"role": "user", "content": "[GAME] You moved disk 1 from A to C.\n"
                                                                "[GAME] Current Board: \nA: [3, 2]\nB: []\nC: [1]\n."}]
    assert all(not s.done and s.reward == 0.0 for s in steps[:-1])
    assert steps[-1] == EnvStep(reward=1.0, done=True, info={"invalid_moves": 0.0})


def test_an_invalid_move_is_answered_and_a_second_in_a_row_ends_the_game_with_its_penalty():
    env = textarena_episode(row("GuessTheNumber-v0", 3))
    first = env.step(Turn("I am not sure", (), 0))
    assert not first.done and first.reward == 0.0 and first.info == {"invalid_moves": 1.0}
    assert first.observation[0]["role"] == "user"
    assert first.observation[0]["content"].startswith("[GAME] You attempted an invalid move. Reason: Invalid move "
                                                      "format.")
    assert env.step(Turn("[1]", (), 1)).info == {"invalid_moves": 0.0}           # a valid move clears the strike
    assert not env.step(Turn("[99]", (), 2)).done                                 # out of range: invalid, answered
    last = env.step(Turn("[99]", (), 3))                                          # twice in a row: textarena ends it
    assert last.done and last.info == {"invalid_moves": 1.0}
    assert last.reward == pytest.approx(1 - abs(1 - env.game.game_number) / 19)  # its partial credit for [1]


def test_last_bracket_moves_only_the_turns_last_bracketed_text():
    assert to_action("[3] is too low, so [7]", "last_bracket") == "[7]"
    assert to_action("no move here", "last_bracket") == "no move here"
    assert to_action("[3] then [7]", "text") == "[3] then [7]"
    thinking = "Moving [A B] would block it, so [A C]"
    plain = textarena_episode(row("TowerOfHanoi-v0", 0)).step(Turn(thinking, (), 0))
    last = textarena_episode(row("TowerOfHanoi-v0", 0), TextArenaSettings(action="last_bracket")).step(
        Turn(thinking, (), 0))
    assert "moved disk 1 from A to B" in plain.observation[0]["content"]           # textarena reads the first
    assert "moved disk 1 from A to C" in last.observation[0]["content"]


def test_wrapped_observations_are_textarenas_own_rendering():
    settings = TextArenaSettings(observation="wrapped")
    env = textarena_episode(row("GuessTheNumber-v0", 3, [{"role": "user", "content": "x"}]),
                            TextArenaSettings(observation="wrapped", check_prompt=False))
    step = env.step(Turn("10", (), 0))                # ActionFormattingWrapper brackets it: a valid guess
    content = step.observation[0]["content"]
    assert content.startswith(env.first_observation)  # LLMObservationWrapper: the whole history again
    assert content.endswith("[Player] [10]\n[GAME] The target number is "
                            f"{'higher' if env.game.game_number > 10 else 'lower'}.")
    assert TextArenaEpisode("GuessTheNumber-v0", 3, settings).first_observation == \
        TextArenaEpisode("GuessTheNumber-v0", 3, TextArenaSettings()).first_observation


def play_2048(episodes: list[TextArenaEpisode], moves: list[str]) -> list[list]:
    """Every episode's observations, the episodes' steps interleaved move by move (as a worker runs them)."""
    seen = [[e.first_observation] for e in episodes]
    for turn in turns(moves):
        for e, out in zip(episodes, seen):
            out.append(e.step(turn).observation)
    return seen


def test_an_episode_replays_from_its_seed_whatever_else_runs_in_the_process():
    moves = ["[up]", "[left]", "[down]", "[right]"] * 3  # 2048 draws each new tile from Python's random
    alone = [play_2048([TextArenaEpisode("2048-v0-ultra-easy", seed, TextArenaSettings())], moves)[0]
             for seed in (1, 2)]
    assert alone[0] != alone[1]
    random.seed(12345)
    together = play_2048([TextArenaEpisode("2048-v0-ultra-easy", seed, TextArenaSettings()) for seed in (1, 2)],
                         moves)
    assert together == alone
    host = random.random()
    random.seed(12345)
    assert host == random.random()                    # the process's own generator did not move


@pytest.mark.parametrize("sample, needle", [
    ({"prompt": "x", "extra_info": {"seed": 1}}, "the data row names no game"),
    ({"prompt": "x", "extra_info": {"env_id": "GuessTheNumber-v0"}}, "extra_info.seed must be an integer"),
    ({"prompt": "x", "extra_info": {"env_id": "GuessTheNumber-v0", "seed": "1"}}, "extra_info.seed must be an integer"),
    ({"prompt": "x", "extra_info": {"env_id": "GuessTheNumbr-v0", "seed": 1}},
     "textarena has no game 'GuessTheNumbr-v0' (closest: GuessTheNumber-v0"),
    ({"prompt": "x", "extra_info": {"env_id": "ConnectFour-v0", "seed": 1}},
     "'ConnectFour-v0' does not start for one player"),
    ({"prompt": "x", "extra_info": {"env_id": "GuessTheNumber-v0", "seed": 1}},
     "the row's prompt does not hold the first observation of 'GuessTheNumber-v0' for seed 1"),
])
def test_a_row_that_names_no_playable_game_stops_the_episodes_start(sample, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        textarena_episode(sample)


def test_the_prompt_check_catches_a_row_written_for_another_seed():
    frozen = row("FrozenLake-v0", 1)
    textarena_episode(frozen)
    with pytest.raises(ValueError, match="describes another game"):
        textarena_episode({**frozen, "extra_info": {"env_id": "FrozenLake-v0", "seed": 2}})
    textarena_episode({**frozen, "extra_info": {"env_id": "FrozenLake-v0", "seed": 2}},
                      TextArenaSettings(check_prompt=False))


def test_the_settings_default_game_serves_rows_that_name_none():
    sample = {"prompt": row("TowerOfHanoi-v0", 0)["prompt"], "extra_info": {"seed": 0}}
    env = textarena_episode(sample, TextArenaSettings(env_id="TowerOfHanoi-v0"))
    assert env.env_id == "TowerOfHanoi-v0"
    with pytest.raises(ValueError, match="closest: TowerOfHanoi-v0"):
        TextArenaSettings(env_id="TowerOfHanoy-v0")
