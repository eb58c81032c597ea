"""A batch's rows as a module sees them: one trimmed sequence per row, and micro-batches under a token budget.

Both depend only on the batch (its prompt and response masks), not on a worker: `model_inputs` is
what every forward of the workers receives, `token_budget_groups` how `max_tokens_per_micro_batch`
groups rows.
"""

from __future__ import annotations

import torch

from ..batch import RLBatch
from ..errors import ConfigError


def model_inputs(batch: RLBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Prompt + response as one sequence, with padding columns shared by every row trimmed.

    Returns input_ids (B, P'+R'), attention_mask, position_ids and R' (the trimmed response width).
    """
    prompt_mask, response_mask = batch["prompt_mask"], batch["response_mask"]
    first = int(prompt_mask.any(0).nonzero()[0]) if prompt_mask.any() else prompt_mask.shape[1] - 1
    width = int(response_mask.any(0).nonzero()[-1]) + 1 if response_mask.any() else 1
    ids = torch.cat([batch["prompts"][:, first:], batch["responses"][:, :width]], dim=1)
    mask = torch.cat([prompt_mask[:, first:], response_mask[:, :width].to(prompt_mask.dtype)], dim=1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids, width


def token_budget_groups(prompt_lengths: list[int], response_lengths: list[int], max_tokens: int,
                        key: str, packed: bool = False) -> list[list[int]]:
    """Rows grouped so that each group's padded size, rows x (longest prompt + longest response), is at
    most max_tokens: rows sorted by length (longest first, ties in row order) and packed greedily.
    packed: the group's real tokens count instead (its rows laid end to end, workers/packing.py).

    A micro-batch is trimmed to its own longest prompt and response (`model_inputs`), so grouping
    rows of similar length wastes little on padding. A row longer than the budget is a ConfigError
    naming `key` and the row.
    """
    lengths = [p + r for p, r in zip(prompt_lengths, response_lengths)]
    longest = max(range(len(lengths)), key=lambda i: lengths[i])
    if lengths[longest] > max_tokens:
        raise ConfigError(f"{key} = {max_tokens} is smaller than the longest row ({lengths[longest]} tokens: prompt "
                          f"{prompt_lengths[longest]} + response {response_lengths[longest]}); raise it to at least "
                          f"{lengths[longest]}")
    groups: list[list[int]] = []
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        group = groups[-1] if groups else None
        if group is not None:
            members = group + [row]
            width = max(prompt_lengths[i] for i in members) + max(response_lengths[i] for i in members)
            size = sum(lengths[i] for i in members) if packed else len(members) * width
            if size <= max_tokens:
                group.append(row)
                continue
        groups.append([row])
    return groups
