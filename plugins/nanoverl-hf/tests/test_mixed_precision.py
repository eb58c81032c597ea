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
from conftest import prompt_batch, with_responses

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


@pytest.mark.parametrize("check", ["share_prompts", "pack"])
def test_in_bf16_the_prompt_cache_and_packing_checks_compare_float32_outputs(tiny_dir, make_config, capsys, check):
    """The one-time checks of the shared prompt cache and of packing compare the model's outputs in its own
    float32 with autocast off: in bf16 the two layouts of SmolLM2 rounded apart by more than a tolerance
    that still catches a misread cache, and both were turned off. The passes themselves run in bf16."""
    only = ["actor.pack=false"] if check == "share_prompts" else ["actor.share_prompts=false", "actor.pack=true"]
    workers = make_workers(make_config(tiny_dir, "model.compute_dtype=bfloat16", *only, "data.batch_size=3"))
    actor, calls = workers.actor, []
    actor.module.get_output_embeddings().register_forward_hook(
        lambda m, a, out: calls.append((torch.is_autocast_enabled("cpu"), out.dtype)))
    prompts = [p for p in ("12=", "5555=", "301=") for _ in range(2)]
    batch = with_responses(prompt_batch(workers.tokenizer, prompts), [[3, 4, 5, 6][:n] for n in (4, 2, 3, 1, 4, 2)],
                           workers.tokenizer.pad_token_id)
    first = actor.compute_log_probs(batch)
    checked, calls[:] = calls[:], []
    torch.testing.assert_close(actor.compute_log_probs(batch), first, rtol=0, atol=0)
    assert "is off for this run" not in capsys.readouterr().err
    assert (actor.forward_pass.cache_keyword if check == "share_prompts" else actor.forward_pass.packing) is not None
    assert calls and set(calls) == {(True, torch.bfloat16)}                      # the pass
    in_check = [call for call in checked if call != (True, torch.bfloat16)]    # the check: before it, in float32
    assert len(in_check) >= 2 and set(in_check) == {(False, torch.float32)} and checked[:len(in_check)] == in_check
