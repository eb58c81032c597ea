"""A distillation teacher sharded on 2 torchrun ranks scores the sampled tokens as the one-process hf teacher does.

The teacher is a model folder with weights (a seed-7 draw of the tiny model: not the student); both runs sample
with the test plugin's `hf_per_prompt` rollout (testkit/), so they see the same tokens, and the 2-rank run's
teacher pass, advantages and updates must equal the one-process run's to float32 summation order.
"""

from __future__ import annotations

import shutil
import sys

import torch
from conftest import EXAMPLE, ROOT, read_metrics, run, torchrun

from nanoverl_core.testing import check_same_run

ARGS = ["--config", str(EXAMPLE), "trainer.total_steps=2", "trainer.save_every=0", "trainer.val_every=0",
        "data.batch_size=4", "rollout.n=4", "actor.micro_batch_size=4", "rollout.name=hf_per_prompt",
        "algorithm.advantage_estimator=distill", "trainer.progress=log"]


def test_a_two_rank_teacher_equals_the_one_process_teacher(tmp_path, testkit_site):
    from transformers import AutoConfig, AutoModelForCausalLM

    teacher = tmp_path / "teacher"
    shutil.copytree(ROOT / "examples" / "tiny_task" / "model", teacher)
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(teacher)).save_pretrained(teacher)
    args = [*ARGS, f"teacher.path={teacher}"]
    plugin = {"PYTHONPATH": str(testkit_site)}
    run([sys.executable, "-m", "nanoverl_core.cli", *args, "worker.name=hf", "actor.share_prompts=false",
         f"trainer.output_dir={tmp_path / 'one'}"], timeout=150, **plugin)
    run(torchrun(2, "-m", "nanoverl_core.cli", *args, f"trainer.output_dir={tmp_path / 'two'}"), timeout=150, **plugin)
    one = read_metrics(tmp_path / "one")
    assert one[1]["teacher/reverse_kl"] > 1e-3                          # a teacher unlike the student (0 if equal)
    assert check_same_run(tmp_path / "one", tmp_path / "two", atol=1e-5, rtol=1e-5) > 20
    assert abs(read_metrics(tmp_path / "two")[2]["teacher/reverse_kl"] - one[2]["teacher/reverse_kl"]) < 1e-5
