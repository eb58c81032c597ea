"""The `reward_model` reward: a tiny sequence classifier built here scores (prompt, response) pairs in
batches exactly as one pair at a time, renders chat rows with its own template, and scores a real CLI
training run (each rollout's score is the classifier's logit of its prompt + response)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanoverl_core.errors import RewardError
from nanoverl_hf.reward_model import RewardModelSettings, pair_text, reward_model
from nanoverl_hf.tiny import build_tokenizer

REPO = Path(__file__).resolve().parents[3]
CHAT = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A 1-layer Llama sequence classifier (num_labels=1) over digits, '=' and the chat template's characters."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    out = tmp_path_factory.mktemp("rm") / "model"
    tokenizer = build_tokenizer("0123456789=:;ua", chat_template=CHAT)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                         num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def one_by_one(folder: Path, texts: list[str]) -> list[float]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        return [float(model(torch.tensor([tokenizer.encode(t, add_special_tokens=False)])).logits[0, 0])
                for t in texts]


def test_batched_scores_equal_one_pair_at_a_time_for_any_batch_size(classifier):
    prompts = ["12=", "3=", "4567=", "8=", "90=", "1="]
    responses = ["12", "", "4567", "81", "9", "1111111"]
    rows = [{"prompt": p} for p in prompts]
    expected = one_by_one(classifier, [p + r for p, r in zip(prompts, responses)])
    assert len(set(expected)) == len(expected)            # the pairs really score differently
    for batch_size in (1, 4, 64):
        got = reward_model(prompts, responses, rows, RewardModelSettings(path=str(classifier), batch_size=batch_size))
        assert got == pytest.approx(expected, abs=1e-5)
    assert reward_model.batched is True


def test_chat_rows_are_rendered_with_the_reward_models_template(classifier):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(classifier)
    row = {"prompt": [{"role": "user", "content": "12"}]}
    assert pair_text(tokenizer, "12=", "34", row, use_chat_template=True) == "u:12;a:34;"
    assert pair_text(tokenizer, "12=", "34", row, use_chat_template=False) == "12=34"
    settings = RewardModelSettings(path=str(classifier))
    assert reward_model(["12="], ["34"], [row], settings) == pytest.approx(one_by_one(classifier, ["u:12;a:34;"]), abs=1e-5)


def test_a_folder_that_is_no_model_is_one_clear_error(tmp_path):
    with pytest.raises(RewardError, match="is not a model folder"):
        reward_model(["1="], ["1"], [{}], RewardModelSettings(path=str(tmp_path)))


def test_a_training_run_is_scored_by_the_reward_model(classifier, tiny_dir, train_file, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "nanoverl_core.cli", "--config", str(REPO / "examples/configs/tiny_grpo.toml"),
         f"model.path={tiny_dir}", f"data.train_files=[{train_file}]", "data.val_files=[]", "data.batch_size=4",
         "rollout.n=2", "trainer.total_steps=2", "trainer.save_every=0", "trainer.progress=none",
         "trainer.rollout_samples=-1", "tracking.trackers=[jsonl]", "algorithm.advantage_estimator=reinforce_plus_plus",
         "reward.name=reward_model", f"reward.reward_model.path={classifier}", "reward.reward_model.batch_size=3",
         "reward.overlong_buffer_len=0",  # the score is the reward model's alone (tiny_grpo.toml adds a penalty)
         f"trainer.output_dir={run_dir}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in (1, 2):
        rollouts = [json.loads(line) for line in (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        expected = one_by_one(classifier, [r["prompt"] + r["response"] for r in rollouts])
        assert [r["score"] for r in rollouts] == pytest.approx(expected, abs=1e-5)
    assert not (run_dir / "reward_errors.jsonl").exists()


def test_the_settings_are_checked_before_anything_loads(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", "--config",
                           str(REPO / "examples/configs/tiny_grpo.toml"), "reward.name=reward_model", "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "reward.reward_model.path" in proc.stderr and "Traceback" not in proc.stderr
