"""End to end through `nanoverl-train` in a subprocess, as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TRAIN = shutil.which("nanoverl-train") or str(Path(sys.executable).parent / "nanoverl-train")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([TRAIN, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_grpo") is None, reason="needs nanoverl-grpo")
def test_tiny_grpo_reward_rises(tmp_path):
    """100 GRPO steps of the quickstart config (~20 s on one thread): the mean reward at least doubles."""
    run = train("--config", "examples/configs/tiny_grpo.toml", "trainer.total_steps=100",
                f"trainer.output_dir={tmp_path / 'run'}", "trainer.val_every=100", "trainer.save_every=0",
                "trainer.progress=none", "tracking.trackers=[jsonl]")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward/mean"] for row in rows]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert len(rows) == 100 and first < 0.12, first                                # random level: ~1/14 a position
    assert last > max(0.15, 2 * first), (first, last)
    assert rows[-1]["val/reward/mean"] > 0.15
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_a_missing_gguf_file_exits_2_with_one_error_line(tmp_path):
    missing = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    run = train("--config", "examples/configs/smollm2_gsm8k_cpu.toml", f"model.path={missing}",
                "data.train_files=[examples/data/tiny_copy/train.jsonl]", f"trainer.output_dir={tmp_path / 'run'}",
                "algorithm.advantage_estimator=reinforce_plus_plus", timeout=60)  # a core estimator: no nanoverl-grpo needed
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("error: model.path") and "does not exist" in lines[-1], run.stderr
    assert "Traceback" not in run.stderr
