"""The pip-installed plugin through nanoverl: found by its entry point, its settings checked when the config
loads, and `nanoverl-train` with a tiny model playing LightsOut-v0 and Secretary-v0 in environment worker
processes, each
dumped episode replayed move by move against textarena directly. Needs nanoverl-hf and nanoverl-grpo
(the example config's worker and estimator) and the plugin installed (`pip install -e .`)."""

import json
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest

from nanoverl_core import ConfigError, load_config, load_registry
from nanoverl_core.env import Turn
from nanoverl_textarena.game import textarena_episode
from nanoverl_textarena.settings import TextArenaSettings

PLUGIN = Path(__file__).resolve().parents[1]
REPO = PLUGIN.parents[2]
CONFIG = PLUGIN / "smollm2_textarena.toml"
# A chat template with an end-of-turn token after each assistant turn: "<user>...<assistant>...<eos><user>...".
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.role == 'assistant' %}<eos>{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A character-level tiny model over printable ASCII (random weights from the seed), and rows of two games
    whose text has no blank lines (which this tokenizer cannot split) and whose every seed is another start,
    so a dumped prompt names its row: LightsOut-v0 (a grid) and Secretary-v0 (a first value; a game lost by
    invalid moves scores -1 there, 0 in LightsOut-v0)."""
    from nanoverl_hf.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("textarena")
    model = build_tiny_model(root / "model", alphabet=string.printable, max_positions=1024, chat_template=TEMPLATE)
    made = subprocess.run([sys.executable, str(PLUGIN / "make_data.py"), "--games", "LightsOut-v0", "Secretary-v0",
                           "--train", "2", "--val", "1", "--out", str(root / "data")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    return {"model": model, "train": root / "data" / "train.jsonl", "val": root / "data" / "val.jsonl"}


def tiny_overrides(tiny: dict[str, Path], run_dir: Path, train: Path | None = None) -> list[str]:
    """The example config with the tiny model in SmolLM2's place, two steps of 2 prompts x 2 samples."""
    return [f"model.path={tiny['model']}", f"data.train_files=[{train or tiny['train']}]",
            f"data.val_files=[{tiny['val']}]", f"trainer.output_dir={run_dir}", "trainer.total_steps=2",
            "trainer.val_every=0", "trainer.save_every=0", "trainer.device=cpu", "trainer.num_threads=1",
            "trainer.progress=none", "trainer.rollout_samples=-1", "data.batch_size=2", "data.max_prompt_length=800",
            "rollout.n=2", "rollout.max_new_tokens=300", "environment.max_turns=3", "environment.max_turn_tokens=8",
            "environment.workers=1", "actor.micro_batch_size=4"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})


def test_the_installed_plugin_registers_textarena_with_its_settings():
    entry = load_registry().entry("environment", "textarena")
    assert entry.provider == "nanoverl-textarena"
    assert entry.obj == "nanoverl_textarena.game:textarena_episode"   # a string: worker processes import it
    config = load_config(CONFIG, ["environment.textarena.env_id=LightsOut-v0"], registry=load_registry())
    assert config.environment.settings == TextArenaSettings(env_id="LightsOut-v0", action="last_bracket")


@pytest.mark.parametrize("override, needle", [
    ("environment.textarena.action=first", "config key 'environment.textarena.action'"),
    ("environment.textarena.observation=full", "config key 'environment.textarena.observation'"),
    ("environment.textarena.colour=red", "environment.textarena.colour"),
])
def test_a_settings_mistake_is_a_config_error_naming_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(CONFIG, [override], registry=load_registry())


def test_an_unknown_game_in_the_config_is_one_error_line_and_exit_2():
    out = cli("--config", CONFIG, "--dry-run", "environment.textarena.env_id=LightOut-v0")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: config key 'environment.textarena.env_id': textarena has no game "
                                       "'LightOut-v0' (closest: LightsOut-v0, LightsOut-v0-raw, LightsOut-v0-train); "
                                       "fix the value in the config or override"]


def test_an_unknown_game_in_a_data_row_stops_the_run_with_one_error_line(tiny, tmp_path):
    rows = [json.loads(line) for line in tiny["train"].read_text().splitlines()]
    rows[1]["extra_info"]["env_id"] = "LightOut-v0"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cli("--config", CONFIG, *tiny_overrides(tiny, tmp_path / "run", train=bad),
)
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: environment 'textarena' on data row 1, start: raised ValueError: textarena has "
                           "no game 'LightOut-v0' (closest: LightsOut-v0"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_a_tiny_model_plays_textarena_through_nanoverl_train_and_each_episode_replays(tiny, tmp_path):
    out = cli("--config", CONFIG, *tiny_overrides(tiny, tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["episode/errors"] == 0 and 1 <= m["episode/turns/mean"] <= 3 and m["episode/env_tokens/mean"] > 0
               and "episode/invalid_moves/mean" in m for m in metrics)
    rows = [json.loads(line) for line in tiny["train"].read_text().splitlines()]
    scores = []
    for step in (1, 2):
        for dumped in map(json.loads, (tmp_path / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()):
            (row,) = [r for r in rows if r["prompt"][1]["content"] in dumped["prompt"]]
            game, total = textarena_episode(row, TextArenaSettings(action="last_bracket")), 0.0
            turns = dumped["episode"]
            assert [t["role"] for t in turns] == ["model", "environment"] * (len(turns) // 2) + ["model"]
            for i, model_turn in enumerate(turns[::2]):          # the model's moves, replayed in textarena
                answer = game.step(Turn(model_turn["text"], (), i))
                assert model_turn["reward"] == answer.reward
                total += answer.reward
                if i + 1 < len(turns[::2]):                     # the run's answer is textarena's, as a user turn
                    assert not answer.done
                    assert turns[2 * i + 1]["text"] == f"<user>{answer.observation[0]['content']}<assistant>"
                else:                                           # the episode ended where the game did (or at max_turns)
                    assert answer.done or len(turns[::2]) == 3
            assert dumped["score"] == pytest.approx(total)
            scores.append(dumped["score"])
    assert len(scores) == 8 and min(scores) < 0       # some games were lost to invalid moves, with textarena's -1
