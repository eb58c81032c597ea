"""Step 4c: a greedy baseline per prompt, for an estimator that reads one (ReMax: `requires_greedy_baseline`)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ..batch import RLBatch
from ..dist import fork_rng, shard_rollout
from .batches import timed


def greedy_baseline(trainer, batch: RLBatch, timing: dict[str, float]) -> tuple[RLBatch, dict[str, float]]:
    """ReMax's baseline: one greedy response per distinct prompt (uid) of `batch`, scored like step 4
    (the overlong penalty included, reward failures written with phase "baseline"); returns each group's
    score on every one of its rows, reward_baselines (B,), and remax/ metrics (the baseline's reward/...,
    its generated tokens). Greedy, and under a forked RNG: the trainer's random stream is untouched."""
    first: dict[Any, int] = {}
    for i, uid in enumerate(batch["uid"]):
        first.setdefault(uid, i)
    rows = batch.index(list(first.values()))
    prompts = RLBatch({k: rows[k] for k in ("prompts", "prompt_mask")},
                      {k: v for k, v in rows.non_tensors.items() if k in ("prompt_text", "row", "index",
                                                                          "data_source", "uid")})
    params = attrs.evolve(trainer.sampling(), temperature=0.0)                 # the training sampling, greedy
    with timed(timing, "baseline_rollout"), fork_rng():
        prompts.update(shard_rollout(lambda b: trainer.rollout.generate(b, params), prompts,
                                     pad_token_id=trainer.tokenizer.pad_token_id,
                                     seed=(trainer.config.trainer.seed, trainer.step, -1)))
    with timed(timing, "baseline_reward"):
        scored, reward_metrics = trainer.reward.score_batch(prompts, trainer.tokenizer, trainer.step, phase="baseline")
    by_uid = dict(zip(prompts["uid"], scored["score"].tolist()))
    baselines = torch.tensor([by_uid[uid] for uid in batch["uid"]], dtype=torch.float32)
    return RLBatch({"reward_baselines": baselines}), {**{f"remax/{k}": v for k, v in reward_metrics.items()},
                                                      "remax/baseline_tokens": float(prompts["response_mask"].sum()),
                                                      "remax/baseline_prompts": float(len(prompts))}
