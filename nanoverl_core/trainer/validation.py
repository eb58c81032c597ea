"""Validation: sample every validation prompt (greedy or n samples), score, summarise per data source."""

from __future__ import annotations

from collections import defaultdict

import torch

from ..data import collate
from .dist import fork_rng


@torch.no_grad()
def validate(trainer) -> dict[str, float]:
    """val/reward/mean (mean@n), val/reward/best@n, and val/<data_source>/reward/mean.

    Runs under a forked RNG (the CPU's and every CUDA device's, since re-seeding seeds them all),
    so validating does not change the training trajectory.
    """
    cfg, data = trainer.config, trainer.val_data
    n = cfg.rollout.val_n
    by_source: dict[str, list[float]] = defaultdict(list)
    means, bests, samples = [], [], []
    with fork_rng():
        torch.manual_seed(cfg.trainer.seed + trainer.step)
        for start in range(0, len(data), cfg.data.val_batch_size):
            indices = list(range(start, min(start + cfg.data.val_batch_size, len(data))))
            batch = collate(data, indices, trainer.tokenizer.pad_token_id, cfg.data.data_source_key)
            batch["uid"] = [f"val-{i}" for i in indices]
            batch = batch.repeat_interleave(n)
            batch.update(trainer.rollout.generate(batch, trainer.sampling(validation=True)))
            scored, _ = trainer.score(batch)
            batch.update(scored)
            scores = scored["score"]
            per_prompt = scores.view(-1, n)  # (prompts, n)
            means += per_prompt.mean(1).tolist()
            bests += per_prompt.max(1).values.tolist()
            for source, score in zip(batch["data_source"], scores.tolist()):
                by_source[source].append(score)
            if len(samples) < 16:
                samples += [{"prompt": batch["prompt_text"][i], "response": batch["response_text"][i],
                             "score": float(scores[i])} for i in range(min(16 - len(samples), len(batch)))]
    trainer._tracker_call("log_samples", "val", samples, trainer.step)
    metrics = {"val/reward/mean": sum(means) / len(means), f"val/reward/best@{n}": sum(bests) / len(bests)}
    if len(by_source) > 1 or "default" not in by_source:
        metrics.update({f"val/{src}/reward/mean": sum(v) / len(v) for src, v in sorted(by_source.items())})
    return metrics
