"""Masked reductions and per-token quantities from logits.

Shapes: B = rows, R = response length, V = vocabulary. A mask is 1 (or True) on valid response
tokens and 0 on padding; values at masked positions never reach a result, even if they are NaN.
Semantics follow verl's `verl/utils/torch_functional.py` (masked_mean adds 1e-8 to the count,
masked_var raises on fewer than two valid elements when unbiased).
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of x where mask is non-zero (weighted by mask), over `dim` (all elements if None).

    x: any shape; mask: same shape as x. NaN / inf at masked positions are replaced by 0 first.
    """
    valid = torch.where(mask.bool(), x, torch.zeros_like(x))
    return (valid * mask).sum() if dim is None else (valid * mask).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """masked_sum(x, mask, dim) / (mask.sum(dim) + 1e-8); 0 where the mask is empty."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / (count + 1e-8)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over all valid elements (a scalar).

    unbiased=True applies Bessel's correction n / (n - 1) and, like verl, raises ValueError when
    fewer than two elements are valid (the correction is undefined).
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 valid elements, got {int(n)}; "
                             "use a larger batch or unbiased=False")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) with mean and unbiased var over valid elements.

    shift_mean=False adds the mean back (rescale only). Padded positions are transformed too
    (not zeroed); callers multiply by the mask where they need zeros.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


CHUNK_ELEMENTS = 1 << 24
"""Logits (16M, 64 MiB in float32) that logprobs_from_logits / entropy_from_logits take at a time."""


def _row_chunks(logits: torch.Tensor) -> range:
    """Starts of the row chunks: as many rows as fit CHUNK_ELEMENTS, at least one."""
    rows = max(1, CHUNK_ELEMENTS // max(1, logits[0].numel())) if len(logits) else 1
    return range(0, logits.shape[0], rows)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position.

    logits: (B, R, V) any float dtype; labels: (B, R) int64 token ids.
    Returns (B, R) float32. Computed in float32 as logit[label] - logsumexp(row) over chunks of rows
    holding at most CHUNK_ELEMENTS logits, so the peak extra memory is one chunk, not a full
    (B, R, V) log-softmax copy, and a small batch is one chunk (no Python loop over rows).
    Differentiable with respect to logits.
    """
    out, chunks = [], _row_chunks(logits)
    for start in chunks:
        chunk = logits[start:start + chunks.step].float()                                     # (b, R, V)
        picked = chunk.gather(-1, labels[start:start + chunks.step].unsqueeze(-1)).squeeze(-1)  # (b, R)
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(out) if out else logits.new_zeros(labels.shape, dtype=torch.float32)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(z) - sum(softmax(z) * z).

    logits: (B, R, V). Returns (B, R) float32, in chunks of rows (see logprobs_from_logits).
    Differentiable with respect to logits.
    """
    out, chunks = [], _row_chunks(logits)
    for start in chunks:
        chunk = logits[start:start + chunks.step].float()                                     # (b, R, V)
        out.append(torch.logsumexp(chunk, dim=-1) - (torch.softmax(chunk, dim=-1) * chunk).sum(-1))
    return torch.cat(out) if out else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)


@torch.no_grad()
def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum over the vocabulary of softmax(logits)^2 per position: exp(logsumexp(2 z) - 2 logsumexp(z)),
    as verl's `calculate_sum_pi_squared_from_logits` (the optimal token baseline's input).

    logits: (B, R, V). Returns (B, R) float32, in chunks of rows (see logprobs_from_logits). No gradient.
    """
    out, chunks = [], _row_chunks(logits)
    for start in chunks:
        chunk = logits[start:start + chunks.step].float()                                     # (b, R, V)
        out.append(torch.exp(torch.logsumexp(2 * chunk, dim=-1) - 2 * torch.logsumexp(chunk, dim=-1)))
    return torch.cat(out) if out else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
