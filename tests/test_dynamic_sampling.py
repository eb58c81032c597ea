"""DAPO's dynamic sampling (algorithm.filter_groups): groups whose scores are all equal are dropped and the
trainer samples more prompts until data.batch_size groups are left or algorithm.filter_groups_max_rounds
rounds ran (`Trainer.generate_until_full`); the loader's state stays exact, so kill-resume is identical."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch

from conftest import EXAMPLES, ROOT, assert_identical_runs, assert_user_error, cli_env, read_metrics, run_cli
from nanoverl_core import RLBatch, load_config, load_registry
from nanoverl_core.algos import first_groups
from nanoverl_core.reward.scoring import place_scores
from nanoverl_core.trainer.batches import concat_rounds, merge_reward_metrics
from nanoverl_core.trainer.trainer import Trainer

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
QUIET = "trainer.progress=none"


# ---- the helpers --------------------------------------------------------------------------------
def test_first_groups_keeps_the_rows_of_the_first_k_groups_in_row_order():
    batch = RLBatch({"x": torch.arange(7)}, {"uid": ["a", "a", "b", "c", "b", "c", "d"]})
    assert first_groups(batch, 2)["x"].tolist() == [0, 1, 2, 4]
    assert first_groups(batch, 9)["x"].tolist() == list(range(7))
    assert len(first_groups(batch.index([]), 2)) == 0


def test_concat_rounds_pads_prompts_on_the_left_and_responses_on_the_right():
    a = RLBatch({"prompts": torch.tensor([[5, 6]]), "prompt_mask": torch.tensor([[1, 1]]),
                 "responses": torch.tensor([[7]]), "response_mask": torch.tensor([[1.0]])}, {"uid": ["a"]})
    b = RLBatch({"prompts": torch.tensor([[4, 5, 6]]), "prompt_mask": torch.tensor([[1, 1, 1]]),
                 "responses": torch.tensor([[7, 8]]), "response_mask": torch.tensor([[1.0, 1.0]])}, {"uid": ["b"]})
    out = concat_rounds([a, b], pad_token_id=0)
    assert out["prompts"].tolist() == [[0, 5, 6], [4, 5, 6]] and out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["responses"].tolist() == [[7, 0], [7, 8]] and out["response_mask"].tolist() == [[1, 0], [1, 1]]
    assert out["uid"] == ["a", "b"] and a["prompts"].shape == (1, 2)  # the inputs are left as they were


def test_reward_metrics_of_several_rounds_are_those_of_all_their_rows():
    rounds = [{"reward/mean": 0.0, "reward/std": 0.0, "reward/errors": 1.0, "reward/acc": 0.5},
              {"reward/mean": 1.0, "reward/std": 0.0, "reward/errors": 2.0, "reward/acc": 1.0}]
    out = merge_reward_metrics(rounds, torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert out == {"reward/mean": 0.5, "reward/std": pytest.approx(0.57735, abs=1e-5), "reward/errors": 3.0,
                   "reward/acc": 0.75}


# ---- the refill, with a score that makes chosen prompts' groups uniform -------------------------
def trainer_with_scores(tmp_path, monkeypatch, informative, *overrides: str) -> Trainer:
    """The debug REINFORCE++ run, prompts in file order (batches of 8, 2 samples each), whose score
    is the sample's place in its group for the prompts where informative(index) holds, else 0."""
    def score(self, batch):
        scores = torch.tensor([float(r % 2) if informative(i) else 0.0 for r, i in enumerate(batch["index"])])
        texts = [""] * len(batch)
        return RLBatch({"score": scores, "token_level_scores": place_scores(scores, batch["response_mask"])},
                       {"response_text": texts}), {"reward/mean": float(scores.mean()), "reward/errors": 0.0}

    monkeypatch.setattr(Trainer, "score", score)
    cfg = load_config(REINFORCE, [f"trainer.output_dir={tmp_path}", "tracking.trackers=[jsonl]", QUIET,
                                  "data.shuffle=false", "data.batch_size=8", "rollout.n=2", "trainer.val_every=0",
                                  "algorithm.filter_groups=true", *overrides], registry=load_registry())
    trainer = Trainer(cfg, load_registry())
    trainer.step = 1
    return trainer


def test_rounds_continue_until_the_batch_holds_batch_size_informative_groups(tmp_path, monkeypatch):
    trainer = trainer_with_scores(tmp_path, monkeypatch, lambda i: i % 4 == 0)   # 2 groups of 8 per round
    batch, metrics = trainer.generate_until_full({})
    assert batch["index"] == [i for i in range(0, 32, 4) for _ in range(2)]
    assert {k: metrics[k] for k in ("filter/rounds", "filter/kept_groups", "filter/batch_full",
                                    "rollout/filtered_groups")} == {"filter/rounds": 4, "filter/kept_groups": 8,
                                                                    "filter/batch_full": 1, "rollout/filtered_groups": 24}
    assert trainer.sampler.state_dict() == {"epoch": 0, "position": 32}            # four rounds of prompts
    assert metrics["rollout/tokens"] > 0 and metrics["reward/mean"] == 8 / 64  # over all 64 rows


def test_more_informative_groups_than_batch_size_are_cut_to_batch_size(tmp_path, monkeypatch):
    trainer = trainer_with_scores(tmp_path, monkeypatch, lambda i: i % 4 != 3)   # 6 of 8 per round
    batch, metrics = trainer.generate_until_full({})
    assert batch["index"] == [i for i in (0, 1, 2, 4, 5, 6, 8, 9) for _ in range(2)]
    assert (metrics["filter/rounds"], metrics["filter/kept_groups"], metrics["filter/batch_full"],
            metrics["rollout/filtered_groups"]) == (2, 8, 1, 4)


def test_when_the_rounds_run_out_the_step_trains_on_what_it_has_and_says_so(tmp_path, monkeypatch):
    trainer = trainer_with_scores(tmp_path, monkeypatch, lambda i: i % 4 == 0, "algorithm.filter_groups_max_rounds=3")
    metrics = trainer.train_step()
    assert (metrics["filter/rounds"], metrics["filter/kept_groups"], metrics["filter/batch_full"]) == (3, 6, 0)
    assert trainer.sampler.state_dict() == {"epoch": 0, "position": 24}
    assert "actor/pg_loss" in metrics and metrics["timing/rollout"] > 0


def test_one_round_without_filter_groups_and_none_with_max_rounds_1_refills(tmp_path, monkeypatch):
    trainer = trainer_with_scores(tmp_path / "a", monkeypatch, lambda i: i % 4 == 0, "algorithm.filter_groups=false")
    batch, metrics = trainer.generate_until_full({})
    assert len(batch) == 16 and not any(k.startswith("filter/") for k in metrics)
    trainer = trainer_with_scores(tmp_path / "b", monkeypatch, lambda i: i % 4 == 0, "algorithm.filter_groups_max_rounds=1")
    batch, metrics = trainer.generate_until_full({})
    assert batch["index"] == [0, 0, 4, 4] and (metrics["filter/rounds"], metrics["filter/batch_full"]) == (1, 0)


def test_a_step_whose_rounds_find_no_informative_group_skips_the_update(tmp_path, monkeypatch, capsys):
    trainer = trainer_with_scores(tmp_path, monkeypatch, lambda i: False, "algorithm.filter_groups_max_rounds=2")
    metrics = trainer.train_step()
    assert (metrics["filter/rounds"], metrics["filter/kept_groups"], metrics["rollout/filtered_groups"]) == (2, 0, 16)
    assert "actor/pg_loss" not in metrics
    assert "every group had equal rewards in 2 rounds; no update" in capsys.readouterr().err


def test_the_loader_resumes_at_the_prompt_after_a_steps_last_round(tmp_path, monkeypatch):
    """20 prompts, batches of 8: an epoch is two batches (its last 4 prompts are skipped), so the 4 rounds
    of step 1 cross an epoch; a run resumed from step 1's checkpoint draws the prompts the first would."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join((ROOT / "examples/data/debug_copy/train.jsonl").read_text().splitlines(True)[:20]))
    args = [f"data.train_files=[{data}]", "trainer.total_steps=1"]
    first = trainer_with_scores(tmp_path / "run", monkeypatch, lambda i: i % 4 == 0, *args)
    first.step = 0
    first.fit()
    assert read_metrics(tmp_path / "run")[0]["filter/rounds"] == 4
    assert first.sampler.state_dict() == {"epoch": 1, "position": 16}
    resumed = trainer_with_scores(tmp_path / "run", monkeypatch, lambda i: i % 4 == 0, *args[:1], "trainer.total_steps=2")
    assert resumed.sampler.state_dict() == {"epoch": 1, "position": 16}
    assert resumed.next_batch()["index"] == first.next_batch()["index"] == list(range(8))  # epoch 2 begins


# ---- the command line ---------------------------------------------------------------------------
def test_a_bad_filter_groups_max_rounds_exits_2_naming_the_key(tmp_path):
    common = ["--config", REINFORCE, "--dry-run", QUIET, f"trainer.output_dir={tmp_path}"]
    assert_user_error(run_cli(*common, "algorithm.filter_groups=true", "algorithm.filter_groups_max_rounds=0"),
                      "'algorithm.filter_groups_max_rounds': 0 is not an integer >= 1")
    assert_user_error(run_cli(*common, "algorithm.filter_groups_max_rounds=3"),
                      "algorithm.filter_groups_max_rounds is set but algorithm.filter_groups = false")
    assert_user_error(run_cli(*common, "algorithm.filter_groups=true", "algorithm.filter_groups_max_rounds=many"),
                      "algorithm.filter_groups_max_rounds", "expected int")
    assert_user_error(run_cli(*common, "algorithm.filter_groups=true", "rollout.n=1"),
                      "algorithm.filter_groups = true needs rollout.n >= 2")


KILL_DRIVER = '''
"""nanoverl-train that SIGKILLs itself in the second generation round of a step from step 3 on."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.trainer.trainer import Trainer

generate_round = Trainer.generate_round


def killing(self, timing, gen_round=0):
    if self.step >= 3 and gen_round == 1:   # the loader has handed out prompts no checkpoint knows of
        os.kill(os.getpid(), signal.SIGKILL)
    return generate_round(self, timing, gen_round)


Trainer.generate_round = killing
sys.exit(main(sys.argv[1:]))
'''


def test_a_refilled_run_killed_mid_refill_resumes_to_the_identical_run(tmp_path):
    """Char-match on the untrained copy task, 4 samples a prompt: most groups score all 0, so steps refill
    (and some run out of rounds); 20 prompts, so rounds cross epochs. SIGKILLed in a step's second round,
    then resumed: the same metrics and the same final weights as the uninterrupted run."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join((ROOT / "examples/data/debug_copy/train.jsonl").read_text().splitlines(True)[:20]))
    args = ["--config", REINFORCE, QUIET, "tracking.trackers=[jsonl]", f"data.train_files=[{data}]",
            "data.batch_size=8", "rollout.n=4", "algorithm.filter_groups=true", "algorithm.filter_groups_max_rounds=3",
            "trainer.total_steps=6", "trainer.save_every=1", "trainer.val_every=3"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    proc = run_cli(*args, f"trainer.output_dir={reference}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(reference)
    assert any(r["filter/rounds"] > 1 for r in rows[2:]) and any(r["filter/batch_full"] == 0 for r in rows), rows
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    proc = subprocess.run([sys.executable, str(driver), *args, f"trainer.output_dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=cli_env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    killed_at = len(read_metrics(run_dir)) + 1
    resumed = run_cli(*args, f"trainer.output_dir={run_dir}")
    assert resumed.returncode == 0 and f"(step {killed_at - 1})" in resumed.stderr, resumed.stderr[-3000:]

    assert_identical_runs(reference, run_dir, "step_000006")
