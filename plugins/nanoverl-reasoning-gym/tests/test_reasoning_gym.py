"""nanoverl-reasoning-gym with the real reasoning_gym: the rows, the verifier as the reward, bad settings,
and a short run through the command line (the hf worker on a tiny random model whose vocabulary holds
every printable character, since Reasoning Gym's questions are English)."""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest

from nanoverl_core import load_config, load_registry
from nanoverl_reasoning_gym.reward import score
from nanoverl_reasoning_gym.settings import ReasoningGymRewardSettings
from nanoverl_reasoning_gym.source import make_source

ROOT = Path(__file__).resolve().parents[3]
TASKS = "data.reasoning_gym.tasks=[{name: chain_sum, params: {max_terms: 2, max_digits: 1}}, {name: gcd, weight: 3}]"
COMMON = ["data.source=reasoning_gym", TASKS, "reward.name=reasoning_gym"]


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=600)


def config(*overrides: str):
    return load_config(None, [*COMMON, *overrides], registry=load_registry())


def error_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_rows_are_a_weighted_mix_fresh_every_epoch_and_never_a_validation_question():
    """Two-term one-digit sums have few distinct questions, so validation's 40 collide with training's
    draws unless they are skipped; gcd has weight 3 of 4."""
    cfg = config("data.reasoning_gym.size=200", "data.reasoning_gym.val_size=40")
    source = make_source(cfg)
    val = {row["question"] for row in source.rows("val", 0)}
    epochs = [source.rows("train", epoch) for epoch in range(2)]
    assert [len(rows) for rows in epochs] == [200, 200]
    for rows in epochs:
        assert not {row["question"] for row in rows} & val
        assert 0.65 < sum(row["data_source"] == "gcd" for row in rows) / len(rows) < 0.85
    assert [r["question"] for r in epochs[0]] != [r["question"] for r in epochs[1]]
    assert make_source(cfg).rows("train", 1) == epochs[1]                 # the same arguments, the same rows
    row = epochs[0][0]
    assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]  # RG's default prompt
    assert row["prompt"][1] == {"role": "user", "content": row["question"]}
    assert json.loads(json.dumps(row)) == row                              # rewards get it in worker processes


def test_the_reward_is_the_tasks_own_verifier_on_the_tagged_answer():
    import reasoning_gym

    rows = make_source(config("data.reasoning_gym.size=20")).rows("train", 0)
    for row in rows:
        ref = row["reasoning_gym"]
        item = reasoning_gym.create_dataset(ref["task"], seed=ref["seed"], size=ref["size"], **ref["params"])[ref["index"]]
        assert item["question"] == row["question"] and item["answer"] == row["ground_truth"]
        assert score("", f"thinking... <answer>{item['answer']}</answer>", row) == 1.0
        assert score("", "<answer>none</answer>", row) == 0.0
        assert score("", item["answer"], row) == 0.0                       # no tags: no answer
        bare = ReasoningGymRewardSettings(answer_tag="")
        assert score("", f" {item['answer']}\n", row, settings=bare) == 1.0


def test_answer_regex_scores_the_last_match_and_its_group_with_the_tasks_verifier():
    """A model that never writes tags but states the number plainly: the last integer is its answer."""
    rows = make_source(config("data.reasoning_gym.size=40")).rows("train", 0)
    last_int = ReasoningGymRewardSettings(answer_regex=r"(?<!\d)-?\d+")
    grouped = ReasoningGymRewardSettings(answer_regex=r"answer is (-?\d+)")
    for row in rows:
        gold, wrong = row["ground_truth"], str(int(row["ground_truth"]) + 1)
        assert score("", f"The numbers are 3 and 4, so the result is {gold}.", row, settings=last_int) == 1.0
        assert score("", f"{gold}, no wait: {wrong}", row, settings=last_int) == 0.0   # only the last one counts
        assert score("", f"<answer>{gold}</answer> and then {wrong}", row, settings=last_int) == 0.0  # tags ignored
        assert score("", "no number at all", row, settings=last_int) == 0.0
        assert score("", f"7 + 8, the answer is {gold} (check: 99)", row, settings=grouped) == 1.0   # the group
        assert score("", f"the answer is {wrong}; {gold}", row, settings=grouped) == 0.0
    minus = next(row for row in make_source(config(
        "data.reasoning_gym.tasks=[{name: basic_arithmetic, params: {min_terms: 2, max_terms: 2, max_digits: 1, "
        "operators: ['-'], allow_parentheses: false, allow_negation: false}}]", "data.reasoning_gym.size=40"
    )).rows("train", 0) if row["ground_truth"].startswith("-"))
    assert score("", f"= {minus['ground_truth']}", minus, settings=last_int) == 1.0        # "-3" keeps its sign
    assert score("", f"9{minus['ground_truth']}", minus, settings=last_int) == 0.0         # "9-3": a minus, not a sign


@pytest.mark.parametrize("override, needles", [
    ("data.reasoning_gym.tasks=[{name: chain_sun}]", ["tasks[0].name = 'chain_sun'", "did you mean 'chain_sum'?"]),
    ("data.reasoning_gym.tasks=[{name: gcd}, {name: chain_sum, params: {min_term: 2}}]",
     ["tasks[1].params.min_term", "task 'chain_sum' has no parameter 'min_term'", "did you mean 'min_terms'?"]),
    ("data.reasoning_gym.tasks=[{name: chain_sum, params: {min_terms: 0, max_digits: 2}}]",
     ["tasks[0].params.min_terms = 0", "out of range for task 'chain_sum'", "min_terms must be positive"]),
    ("data.reasoning_gym.tasks=[]", ["[data.reasoning_gym] tasks is empty"]),
    ("data.reasoning_gym.tasks=[{name: gcd, weight: 0}]", ["'data.reasoning_gym.tasks[0].weight': 0.0 is not a finite number > 0"]),
    ("reward.reasoning_gym.answer_regex='(-)?(\\d+)'", ["reward.reasoning_gym.answer_regex", "has 2 groups", "(?:...)"]),
    ("reward.reasoning_gym.answer_regex='(\\d+'", ["reward.reasoning_gym.answer_regex", "is not a regular expression"]),
])
def test_bad_settings_exit_2_with_one_line_before_anything_is_written(tmp_path, override, needles):
    run_dir = tmp_path / "run"
    for extra in (["--dry-run"], []):
        line = error_line(run_cli("--config", "examples/configs/debug_reinforce.toml", *COMMON, override,
                                  "data.train_files=[]", "data.val_files=[]", f"trainer.output_dir={run_dir}", *extra))
        for needle in needles:
            assert needle in line, (needle, line)
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from nanoverl_hf.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", alphabet=string.printable, max_positions=512)


def test_a_short_run_trains_on_generated_rows_scored_by_the_verifier(tiny_model, tmp_path):
    """Three GRPO steps on the hf worker, validation on its own rows per task; every sampled response's
    logged score is the verifier's score of that response for the row it answered."""
    run_dir = tmp_path / "run"
    args = ["--config", "examples/configs/tiny_grpo.toml", *COMMON, "data.train_files=[]", "data.val_files=[]",
            "data.reasoning_gym.size=16", "data.reasoning_gym.val_size=8", "data.reasoning_gym.system_prompt=direct",
            "data.apply_chat_template=false", "data.max_prompt_length=400", "data.batch_size=4", "rollout.n=2",
            "rollout.max_new_tokens=8", f"model.path={tiny_model}", "trainer.total_epochs=3", "trainer.val_every=2",
            "reward.overlong_buffer_len=0", "trainer.rollout_samples=-1", "trainer.progress=none", "tracking.trackers=[jsonl]",
            f"trainer.output_dir={run_dir}"]
    dry = run_cli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert json.loads(dry.stdout)["schedule"]["total_steps"] == 12
    proc = run_cli(*args, "trainer.total_epochs=0", "trainer.total_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert {"val/reward/mean", "val/gcd/reward/mean", "val/chain_sum/reward/mean"} <= set(metrics[1])
    source = make_source(config("data.reasoning_gym.size=16", "data.reasoning_gym.val_size=8",
                                "data.reasoning_gym.system_prompt=direct"))
    by_question = {row["question"]: row for row in source.rows("train", 0)}
    scored = 0
    for step in (1, 2, 3):
        for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
            sample = json.loads(line)
            row = by_question[sample["prompt"].split("\n", 1)[1]]          # system prompt, newline, question
            assert sample["score"] == score("", sample["response"], row)
            scored += 1
    assert scored == 3 * 4 * 2
