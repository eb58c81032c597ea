"""Log-probs and entropy through a linear LM head, a chunk of positions at a time.

`logprobs_from_logits(model(...).logits, labels)` keeps the whole (N, V) float32 logits alive for
backward (and its backward makes a second (N, V) tensor, the softmax): at a 49k vocabulary that is
200 KB per position, several times a small model's per-token activations. `logprobs_from_hidden`
takes the hidden states the head would see instead and never holds more than one chunk of logits:
the forward keeps only the per-position logsumexp (and entropy), the backward recomputes each
chunk's logits from the saved hidden states and weight. Equal to the plain path in values and
gradients (tests/test_chunked_head.py). The price is one extra head product per position in backward
(none when all positions fit one chunk: then that chunk's logits are kept, as the plain path keeps them).

Shapes: N = positions, H = hidden size, V = vocabulary, c = chunk_size.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """(c, H) -> (c, V) logits / temperature in `dtype`. The product runs in the head's own dtype, as the
    model's nn.Linear does (so a bf16 model gives the plain path's numbers, and no float32 copy of the
    (V, H) weight is made), or under autocast (model.compute_dtype) in its dtype, as the nn.Linear would; the
    softmax arithmetic after it runs in float32 or wider."""
    z = F.linear(hidden, weight, bias).to(dtype)      # a fresh tensor: the in-place ops below touch nothing else
    return z.div_(temperature) if temperature != 1.0 else z


def _stats(z: torch.Tensor, labels: torch.Tensor, with_entropy: bool):
    """(c, V) logits -> each position's logsumexp, its label's log-prob and (with_entropy, else None) the
    entropy: the forward's arithmetic after the product, written plainly for torch.compile to fuse (one
    read of z instead of one per operation)."""
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels[:, None])[:, 0] - lse
    entropy = lse - torch.exp(z - lse[:, None]).mul(z).sum(-1) if with_entropy else None
    return lse, log_probs, entropy


def _stats_in_place(z: torch.Tensor, labels: torch.Tensor, with_entropy: bool):
    """`_stats` in eager PyTorch with one (c, V) temporary (z itself stays intact: it may be kept for backward)."""
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels[:, None])[:, 0] - lse
    entropy = lse - z.sub(lse[:, None]).exp_().mul_(z).sum(-1) if with_entropy else None   # H = lse - sum(p * z)
    return lse, log_probs, entropy


def _grad_z(z: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor | None, labels: torch.Tensor,
            grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> torch.Tensor:
    """The gradient with respect to the (c, V) logits z of the log-probs and entropy (`_backward`'s formulas),
    written plainly for torch.compile to fuse into one pass over z."""
    p = torch.exp(z - lse[:, None])
    grad = torch.zeros_like(z)
    if grad_entropy is not None:
        grad = (z - (lse - entropy)[:, None]) * p * -grad_entropy[:, None]
    if grad_log_probs is not None:
        g = grad_log_probs[:, None]
        grad = (grad - p * g).scatter_add(1, labels[:, None], g)
    return grad


def _grad_z_in_place(z: torch.Tensor, overwrite: bool, lse: torch.Tensor, entropy: torch.Tensor, labels: torch.Tensor,
                     grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> torch.Tensor:
    """`_grad_z` in eager PyTorch with as few (c, V) tensors as it takes: z itself is reused when `overwrite`
    (a recomputed chunk), not when it is the forward's kept chunk."""
    p = z.sub(lse[:, None]).exp_()                                         # softmax(z)
    grad_z = None
    if grad_entropy is not None:
        # dH/dz_k = -p_k (z_k - sum_j p_j z_j), and sum_j p_j z_j = lse - H
        mean_z = (lse - entropy)[:, None]
        shifted = z.sub_(mean_z) if overwrite else z.sub(mean_z)
        grad_z = shifted.mul_(p).mul_(-grad_entropy[:, None])
    if grad_log_probs is not None:
        # d log p_label / dz = onehot(label) - p
        g = grad_log_probs[:, None]
        p.mul_(-g).scatter_add_(1, labels[:, None], g)
        grad_z = p if grad_z is None else grad_z.add_(p)
    return grad_z


@functools.cache
def _compiled(fn):
    """`fn` through torch.compile with dynamic shapes (positions per chunk vary), compiled once per process."""
    return torch.compile(fn, dynamic=True)


class _LinearLogProbs(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, with_entropy, chunk_size, compiled):
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=dtype, device=hidden.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else log_probs.new_empty(0)
        z = None
        stats = _compiled(_stats) if compiled else _stats_in_place
        for s in range(0, n, chunk_size):
            z = _chunk_logits(hidden[s:s + chunk_size], weight, bias, temperature, dtype)     # (c, V)
            lse[s:s + chunk_size], log_probs[s:s + chunk_size], chunk_entropy = stats(z, labels[s:s + chunk_size],
                                                                                      with_entropy)
            if with_entropy:
                entropy[s:s + chunk_size] = chunk_entropy
        # O(N) numbers besides the inputs; and when everything was one chunk, its logits too: holding them
        # costs what the plain path holds anyway, and saves backward the recomputation
        one_chunk = z if 0 < n <= chunk_size and any(ctx.needs_input_grad[:3]) else None
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy, one_chunk)
        ctx.temperature, ctx.chunk_size, ctx.compiled = temperature, chunk_size, compiled
        # backward recomputes the chunks' logits: under the forward's autocast, so as the forward made them
        device = hidden.device.type
        ctx.autocast = dict(device_type=device, enabled=torch.is_autocast_enabled(device),
                            dtype=torch.get_autocast_dtype(device))
        ctx.set_materialize_grads(False)                  # an unused output's gradient arrives as None
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_log_probs, grad_entropy):
        with torch.autocast(**ctx.autocast):
            return _LinearLogProbs._backward(ctx, grad_log_probs, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, bias, labels, lse, entropy, one_chunk = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        temperature, size, dtype = ctx.temperature, ctx.chunk_size, lse.dtype
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # accumulated over chunks in float32 (or wider), in place (autocast leaves addmm_ alone), cast to the
        # weight's dtype once at the end; the first chunk's product overwrites it (beta=0), so no (V, H) zeros
        # are filled first unless there is no chunk at all
        grad_weight = (torch.empty if len(hidden) else torch.zeros)(weight.shape, dtype=dtype, device=weight.device) \
            if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=dtype, device=weight.device) if need_bias else None
        if grad_entropy is not None and entropy.numel() == 0:
            grad_entropy = None
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None, None, None, None
        for s in range(0, hidden.shape[0], size):
            h, chunk = hidden[s:s + size], slice(s, s + size)
            z = one_chunk if one_chunk is not None else _chunk_logits(h, weight, bias, temperature, dtype)  # (c, V)
            grads = (None if grad_log_probs is None else grad_log_probs[chunk],
                     None if grad_entropy is None else grad_entropy[chunk])
            if ctx.compiled:
                grad_z = _compiled(_grad_z)(z, lse[chunk], entropy[chunk] if grads[1] is not None else None,
                                            labels[chunk], *grads)
            else:
                grad_z = _grad_z_in_place(z, one_chunk is None, lse[chunk], entropy[chunk], labels[chunk], *grads)
            if temperature != 1.0:
                grad_z.div_(temperature)                  # z = logits / T
            grad_z = grad_z.to(weight.dtype)              # as the plain path's .float() hands it back to the head
            if need_hidden:
                grad_hidden[chunk] = grad_z @ weight
            if need_weight:
                grad_weight.addmm_(grad_z.T.to(dtype), h.to(dtype), beta=0 if s == 0 else 1)
            if need_bias:
                grad_bias += grad_z.sum(0).to(dtype)
        return (grad_hidden, grad_weight.to(weight.dtype) if need_weight else None,
                grad_bias.to(bias.dtype) if need_bias else None, None, None, None, None, None)


def logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         bias: torch.Tensor | None = None, *, temperature: float = 1.0, with_entropy: bool = False,
                         chunk_size: int = 1024, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(z)[label] and the entropy of softmax(z), z = (hidden @ weight.T + bias) / temperature.

    hidden:  (N, H) the head's input at the positions to score (any float dtype; usually only the
             valid response positions, gathered with a mask)
    weight:  (V, H) the head's weight (nn.Linear convention); bias: (V,) or None
    labels:  (N,) int64 token ids
    Returns (log_probs (N,), entropy (N,) or None), float32 (float64 for float64 inputs).
    Differentiable with respect to hidden, weight and bias. The extra memory is a few (chunk_size, V)
    float32 tensors at a time, never (N, V); chunk_size is positions per chunk. compiled: the arithmetic
    after each chunk's product (log-sum-exp, entropy, their gradient) through torch.compile, fused into one
    pass over the chunk's logits (`model.compile`); the same numbers to float rounding.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size = {chunk_size} must be at least 1")
    log_probs, entropy = _LinearLogProbs.apply(hidden, weight, bias, labels, float(temperature), with_entropy,
                                               chunk_size, compiled)
    return log_probs, (entropy if with_entropy else None)
