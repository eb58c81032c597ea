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


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position.

    logits: (B, R, V) any float dtype; labels: (B, R) int64 token ids.
    Returns (B, R) float32. Computed one row at a time in float32 as logit[label] - logsumexp(row),
    so the peak extra memory is one row's (R, V) in float32, not a full (B, R, V) log-softmax copy.
    Differentiable with respect to logits.
    """
    out = []
    for row_logits, row_labels in zip(logits, labels):  # (R, V), (R,)
        row = row_logits.float()
        picked = row.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1)  # (R,)
        out.append(picked - torch.logsumexp(row, dim=-1))
    return torch.stack(out) if out else logits.new_zeros(labels.shape, dtype=torch.float32)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(z) - sum(softmax(z) * z).

    logits: (B, R, V). Returns (B, R) float32, one row at a time (see logprobs_from_logits).
    Differentiable with respect to logits.
    """
    out = []
    for row_logits in logits:  # (R, V)
        row = row_logits.float()
        out.append(torch.logsumexp(row, dim=-1) - (torch.softmax(row, dim=-1) * row).sum(-1))
    return torch.stack(out) if out else logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
