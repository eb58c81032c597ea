"""model.compute_dtype in the hf plugin: the rollout generates under it, and a run trains in it end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import prompt_batch

from nanoverl_core import SamplingParams
from nanoverl_hf.rollout import HFRollout
from nanoverl_hf.workers import make_workers

REPO = Path(__file__).resolve().parents[3]
PROMPTS = ["12=", "9=", "5555=", "301=", "12=", "9="]   # repeats: the shared prompt cache runs under it too


@pytest.mark.parametrize("share", [True, False], ids=["actors_module", "own_copy"])
def test_the_rollout_generates_under_the_compute_dtype_and_only_then(tiny_dir, make_config, share):
    """Every linear layer of prefill and decoding runs in bf16 with compute_dtype = "bfloat16" (on the
    actor's module and on a rollout's own copy), in float32 with no autocast at all by default."""
    for compute, want in (("", {(False, torch.float32)}), ("bfloat16", {(True, torch.bfloat16)})):
        config = make_config(tiny_dir, f"model.compute_dtype={compute}", "trainer.seed=1")
        workers = make_workers(config)
        rollout = HFRollout(config, workers, share=share)
        calls = []
        for sub in rollout.module.modules():
            if isinstance(sub, torch.nn.Linear):
                sub.register_forward_hook(lambda m, a, out: calls.append((torch.is_autocast_enabled("cpu"), out.dtype)))
        out = rollout.generate(prompt_batch(workers.tokenizer, PROMPTS), SamplingParams(max_new_tokens=6))
        assert out["responses"].shape[0] == len(PROMPTS) and out["response_mask"].sum() > 0
        assert len(calls) > 10 and set(calls) == want
        assert {p.dtype for p in rollout.module.parameters()} == {torch.float32}


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_grpo") is None, reason="needs nanoverl-grpo")
def test_a_bf16_mixed_precision_grpo_run_trains_and_saves_float32_weights(tmp_path):
    """The quickstart config with compute_dtype = "bfloat16" through the CLI: 3 steps with finite losses and
    nonzero gradients, and a checkpoint whose weights and AdamW state are float32."""
    from safetensors.torch import load_file

    train = shutil.which("nanoverl-train") or str(Path(sys.executable).parent / "nanoverl-train")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run([train, "--config", "examples/configs/tiny_grpo.toml", "model.compute_dtype=bfloat16",
                          "trainer.total_steps=3", "trainer.save_every=3", "trainer.val_every=0",
                          "data.batch_size=4", "rollout.n=8", f"trainer.output_dir={tmp_path / 'run'}",
                          "tracking.trackers=[jsonl]"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor([r["actor/pg_loss"], r["actor/grad_norm"]])).all() for r in rows)
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    saved = load_file(str(tmp_path / "run" / "checkpoints" / "step_000003" / "actor" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    optimizer = torch.load(tmp_path / "run" / "checkpoints" / "step_000003" / "actor" / "optimizer.pt")
    assert {t.dtype for s in optimizer["state"].values() for t in s.values() if t.dim() > 0} == {torch.float32}
