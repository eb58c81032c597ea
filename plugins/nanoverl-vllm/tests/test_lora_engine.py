"""The vllm rollout next to a LoRA actor (peft): the engine gets the merged weights, streamed one
tensor at a time after every update, and generates what HF generates with those merged weights.

This is the default sync mode ([rollout.vllm] lora_sync = "merged"): the adapter never reaches vLLM, so
vLLM's LoRA kernels (and their `enable_lora` / `max_lora_rank` limits) play no part. The adapter-only
mode is tested in test_lora_adapter_sync.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from conftest import kept, prompt_batch  # noqa: E402
from test_engine import GREEDY, PROMPTS, train_to_answer  # noqa: E402

from nanoverl_core import TorchActor, Workers  # noqa: E402
from nanoverl_hf.models import load_policy, resolve_source  # noqa: E402
from nanoverl_hf.rollout import HFRollout  # noqa: E402
from nanoverl_hf.workers import make_workers  # noqa: E402
from nanoverl_vllm.rollout import make_rollout  # noqa: E402

pytestmark = pytest.mark.engine


def test_vllm_after_a_lora_sync_equals_hf_greedy_with_the_merged_weights(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "trainer.seed=3", "actor.lr=3e-2", "model.lora.enable=true", "model.lora.rank=8",
                      "model.lora.alpha=16")
    workers = make_workers(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():                     # a varied base: a random-init tiny model answers everything with '='
        for p in workers.actor.module.parameters():
            if not p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    rollout = make_rollout(cfg, workers)
    try:
        tok = workers.tokenizer
        batch = prompt_batch(tok, ["12=", "34=", *PROMPTS[1:]])
        before = rollout.generate(batch, GREEDY)
        target = [11] * 6
        assert kept(before, 0) != target
        train_to_answer(workers, target)
        state = {k: v.clone() for k, v in workers.actor.module.state_dict().items()}
        for _ in range(3):                                                    # repeated syncs: no drift
            rollout.sync_weights(workers.actor)
        assert all(torch.equal(v, state[k]) for k, v in workers.actor.module.state_dict().items())
        after = rollout.generate(batch, GREEDY)
        assert kept(after, 0) == target and kept(after, 1) == target
        plain = load_policy(cfg, resolve_source(cfg.model))                   # a plain model, the merged weights
        plain.load_state_dict(dict(workers.actor.full_tensors()))
        plain.generation_config = workers.actor.module.generation_config
        merged = Workers(tokenizer=tok, actor=TorchActor(plain, cfg, trainable=False))
        want = HFRollout(cfg, merged).generate(batch, GREEDY)
        assert torch.equal(after["responses"], want["responses"])
        assert torch.equal(after["response_mask"], want["response_mask"])
        assert torch.equal(HFRollout(cfg, workers).generate(batch, GREEDY)["responses"], want["responses"])
        assert len({tuple(kept(after, r)) for r in range(len(batch))}) >= 2   # not every row gives the target
    finally:
        rollout.close()
