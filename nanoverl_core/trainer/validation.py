"""Validation: sample every validation prompt (greedy or n samples), score, summarise per data source.

`evaluate` is the pure part (a rollout, a reward, the data): the trainer's `validate` and the
`nanoverl-train eval` command both call it.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from ..data import collate
from ..rollout import SamplingParams, decode_responses
from .dist import fork_rng


@torch.no_grad()
def evaluate(config, rollout, tokenizer, scorer, data, params: SamplingParams, n: int,
             seed: int) -> tuple[dict[str, float], list[dict]]:
    """mean@n, best@n and per-data-source means of `scorer` over every prompt of `data`, n samples each.

    Returns ({"reward/mean", f"reward/best@{n}", "<source>/reward/mean" (when there are sources)},
    up to 16 sample rows). Runs under a forked RNG seeded from `seed` (the CPU's and every CUDA
    device's, since re-seeding seeds them all), so it leaves the caller's random stream untouched.
    """
    by_source: dict[str, list[float]] = defaultdict(list)
    means, bests, samples = [], [], []
    with fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(data), config.data.val_batch_size):
            indices = list(range(start, min(start + config.data.val_batch_size, len(data))))
            batch = collate(data, indices, tokenizer.pad_token_id, config.data.data_source_key)
            batch["uid"] = [f"val-{i}" for i in indices]
            batch = batch.repeat_interleave(n)
            batch.update(rollout.generate(batch, params))
            texts = decode_responses(tokenizer, batch)
            scores, _ = scorer.score(batch, texts)
            per_prompt = scores.view(-1, n)  # (prompts, n)
            means += per_prompt.mean(1).tolist()
            bests += per_prompt.max(1).values.tolist()
            for source, score in zip(batch["data_source"], scores.tolist()):
                by_source[source].append(score)
            samples += [{"prompt": batch["prompt_text"][i], "response": texts[i], "score": float(scores[i])}
                        for i in range(min(16 - len(samples), len(batch)))]
    metrics = {"reward/mean": sum(means) / len(means), f"reward/best@{n}": sum(bests) / len(bests)}
    if len(by_source) > 1 or "default" not in by_source:
        metrics.update({f"{src}/reward/mean": sum(v) / len(v) for src, v in sorted(by_source.items())})
    return metrics, samples


def validate(trainer) -> dict[str, float]:
    """val/reward/mean (mean@n), val/reward/best@n, and val/<data_source>/reward/mean; samples go to the trackers."""
    cfg = trainer.config
    metrics, samples = evaluate(cfg, trainer.rollout, trainer.tokenizer, trainer.reward, trainer.val_data,
                                trainer.sampling(validation=True), cfg.rollout.val_n, cfg.trainer.seed + trainer.step)
    trainer._tracker_call("log_samples", "val", samples, trainer.step)
    return {f"val/{key}": value for key, value in metrics.items()}
