"""Step 4c: a greedy baseline per prompt, for an estimator that reads one (ReMax: `requires_greedy_baseline`)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ..batch import RLBatch
from ..dist import fork_rng, shard_rollout
from ..rollout import SamplingParams, rollout_rows
from .batches import timed


def greedy_baseline(batch: RLBatch, rollout, scorer, tokenizer, params: SamplingParams, seed: int, step: int,
                    timing: dict[str, float]) -> tuple[RLBatch, dict[str, float]]:
    """ReMax's baseline: one greedy response per distinct prompt (uid) of `batch` from `rollout`, sampled as
    `params` say but greedy, scored by `scorer` like step 4 (the overlong penalty included, reward failures
    written with phase "baseline"); returns each group's score on every one of its rows, reward_baselines
    (B,), and remax/ metrics (the baseline's reward/..., its generated tokens). Greedy, and under a forked
    RNG: the trainer's random stream is untouched; under torchrun its rows are seeded from (`seed`, `step`)
    (`shard_rollout`), apart from the step's samples."""
    first: dict[Any, int] = {}
    for i, uid in enumerate(batch["uid"]):
        first.setdefault(uid, i)
    rows = batch.index(list(first.values()))
    prompts = RLBatch({k: rows[k] for k in ("prompts", "prompt_mask")},
                      {k: v for k, v in rows.non_tensors.items() if k in ("prompt_text", "row", "index",
                                                                          "data_source", "uid")})
    greedy = attrs.evolve(params, temperature=0.0)
    with timed(timing, "baseline_rollout"), fork_rng():
        prompts = rollout_rows(prompts, shard_rollout(lambda b: rollout.generate(b, greedy), prompts,
                                                      pad_token_id=tokenizer.pad_token_id, seed=(seed, step, -1)),
                               split_rows=False)
    with timed(timing, "baseline_reward"):
        scored, reward_metrics = scorer.score_batch(prompts, tokenizer, step, phase="baseline")
    by_uid = dict(zip(prompts["uid"], scored["score"].tolist()))
    baselines = torch.tensor([by_uid[uid] for uid in batch["uid"]], dtype=torch.float32)
    return RLBatch({"reward_baselines": baselines}), {**{f"remax/{k}": v for k, v in reward_metrics.items()},
                                                      "remax/baseline_tokens": float(prompts["response_mask"].sum()),
                                                      "remax/baseline_prompts": float(len(prompts))}
