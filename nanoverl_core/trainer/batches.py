"""Pure helpers of the trainer's step: timing, expanding prompts, joining generation rounds, and the
metric summaries of a step's batch (what was sampled, what the machine did)."""

from __future__ import annotations

import random
import statistics
import time
import uuid
from contextlib import contextmanager

import torch

from ..algos import masked_mean, uniform_groups
from ..batch import RLBatch, is_episodes
from ..env import episode_metrics
from ..processes import resident_mib, step_peaks_mib


@contextmanager
def timed(timing: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def expand(batch: RLBatch, n: int) -> RLBatch:
    """Each prompt repeated n times in place; rows of one prompt share a fresh uid."""
    batch["uid"] = [uuid.UUID(int=random.getrandbits(128)).hex for _ in range(len(batch))]
    return batch.repeat_interleave(n)


def informative_groups(batch: RLBatch) -> int:
    """How many of the batch's groups have scores that are not all equal (those filter_groups keeps)."""
    uniform = uniform_groups(batch["score"], batch["uid"]).tolist()
    return len({uid for uid, same in zip(batch["uid"], uniform) if not same})


def concat_rounds(batches: list[RLBatch], pad_token_id: int) -> RLBatch:
    """The rows of several generation rounds in order, padded to common widths: prompts (and prompt_mask)
    on the left, every other (B, width) column on the right (responses with pad_token_id, the rest with 0)."""
    if len(batches) == 1:
        return batches[0]
    batches = [RLBatch(dict(b.tensors), b.non_tensors) for b in batches]
    for key in [k for k, v in batches[0].tensors.items() if v.dim() == 2]:
        width = max(b[key].shape[1] for b in batches)
        left = key in ("prompts", "prompt_mask")
        fill = pad_token_id if key in ("prompts", "responses") else 0
        for b in batches:
            missing = width - b[key].shape[1]
            b[key] = torch.nn.functional.pad(b[key], (missing, 0) if left else (0, missing), value=fill)
    return RLBatch.concat(batches)


def merge_reward_metrics(rounds: list[dict[str, float]], scores: torch.Tensor) -> dict[str, float]:
    """The reward metrics of several rounds of equally many rows as over all their rows: counts
    (reward/errors, reward/timeouts, reward/crashes) summed, means averaged, reward/std over all `scores` (B,)."""
    counts = ("reward/errors", "reward/timeouts", "reward/crashes")
    keys = {k: None for r in rounds for k in r}
    out = {k: (sum if k in counts else statistics.fmean)([r[k] for r in rounds if k in r]) for k in keys}
    out["reward/mean"] = float(scores.mean())
    out["reward/std"] = float(scores.std()) if len(scores) > 1 else 0.0
    return out


def rollout_metrics(batch: RLBatch) -> dict[str, float]:
    """What was sampled (response_mask, truncated: the rollout's own facts; a multi-turn episode's turns)."""
    lengths, prompts = batch["response_mask"].sum(-1), batch["prompt_mask"].sum(-1).float()
    return {"rollout/response_length/mean": float(lengths.mean()), "rollout/response_length/max": float(lengths.max()),
            "rollout/prompt_length/mean": float(prompts.mean()), "rollout/tokens": float(lengths.sum() + prompts.sum()),
            "rollout/truncated_frac": float(batch["truncated"].float().mean()),
            **(episode_metrics(batch) if is_episodes(batch) else {})}


def batch_metrics(batch: RLBatch, timing: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
    out = {"throughput/tokens_per_s": metrics["rollout/tokens"] / max(timing["step"], 1e-9)}
    if (rss := resident_mib()) is not None:                 # the trainer process, at the step's end
        out["perf/rss_mib"] = rss
    out.update(step_peaks_mib())                            # the step's peaks: the trainer, and its children summed
    if "values" in batch:
        out["critic/values/mean"] = float(masked_mean(batch["values"], batch["loss_mask"]))
        out["critic/returns/mean"] = float(masked_mean(batch["returns"], batch["loss_mask"]))
    out.update({f"timing/{k}": v for k, v in timing.items()})
    return out
