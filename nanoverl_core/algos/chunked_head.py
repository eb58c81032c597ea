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


class _LinearLogProbs(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, with_entropy, chunk_size):
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=dtype, device=hidden.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else log_probs.new_empty(0)
        z = None
        for s in range(0, n, chunk_size):
            z = _chunk_logits(hidden[s:s + chunk_size], weight, bias, temperature, dtype)     # (c, V)
            lse[s:s + chunk_size] = torch.logsumexp(z, dim=-1)
            log_probs[s:s + chunk_size] = z.gather(-1, labels[s:s + chunk_size, None])[:, 0] - lse[s:s + chunk_size]
            if with_entropy:                              # H = lse - sum(p * z)
                p = z.sub(lse[s:s + chunk_size, None]).exp_()
                entropy[s:s + chunk_size] = lse[s:s + chunk_size] - p.mul_(z).sum(-1)
        # O(N) numbers besides the inputs; and when everything was one chunk, its logits too: holding them
        # costs what the plain path holds anyway, and saves backward the recomputation
        one_chunk = z if 0 < n <= chunk_size and any(ctx.needs_input_grad[:3]) else None
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy, one_chunk)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
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
        # accumulated over chunks in float32 (or wider), cast to the weight's dtype once at the end
        grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=dtype, device=weight.device) if need_bias else None
        if grad_entropy is not None and entropy.numel() == 0:
            grad_entropy = None
        for s in range(0, hidden.shape[0], size):
            h, chunk = hidden[s:s + size], slice(s, s + size)
            z = one_chunk if one_chunk is not None else _chunk_logits(h, weight, bias, temperature, dtype)  # (c, V)
            p = z.sub(lse[chunk, None]).exp_()                                     # softmax(z)
            grad_z = None
            if grad_entropy is not None:
                # dH/dz_k = -p_k (z_k - sum_j p_j z_j), and sum_j p_j z_j = lse - H
                mean_z = (lse[chunk] - entropy[chunk])[:, None]
                shifted = z.sub_(mean_z) if one_chunk is None else z.sub(mean_z)   # a kept chunk stays intact
                grad_z = shifted.mul_(p).mul_(-grad_entropy[chunk, None])
            if grad_log_probs is not None:
                # d log p_label / dz = onehot(label) - p
                g = grad_log_probs[chunk, None]
                p.mul_(-g).scatter_add_(1, labels[chunk, None], g)
                grad_z = p if grad_z is None else grad_z.add_(p)
            if grad_z is None:
                continue
            if temperature != 1.0:
                grad_z.div_(temperature)                  # z = logits / T
            grad_z = grad_z.to(weight.dtype)              # as the plain path's .float() hands it back to the head
            if need_hidden:
                grad_hidden[chunk] = grad_z @ weight
            if need_weight:
                grad_weight.addmm_(grad_z.T.to(dtype), h.to(dtype))
            if need_bias:
                grad_bias += grad_z.sum(0).to(dtype)
        return (grad_hidden, grad_weight.to(weight.dtype) if need_weight else None,
                grad_bias.to(bias.dtype) if need_bias else None, None, None, None, None)


def logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         bias: torch.Tensor | None = None, *, temperature: float = 1.0, with_entropy: bool = False,
                         chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(z)[label] and the entropy of softmax(z), z = (hidden @ weight.T + bias) / temperature.

    hidden:  (N, H) the head's input at the positions to score (any float dtype; usually only the
             valid response positions, gathered with a mask)
    weight:  (V, H) the head's weight (nn.Linear convention); bias: (V,) or None
    labels:  (N,) int64 token ids
    Returns (log_probs (N,), entropy (N,) or None), float32 (float64 for float64 inputs).
    Differentiable with respect to hidden, weight and bias. The extra memory is a few (chunk_size, V)
    float32 tensors at a time, never (N, V); chunk_size is positions per chunk.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size = {chunk_size} must be at least 1")
    log_probs, entropy = _LinearLogProbs.apply(hidden, weight, bias, labels, float(temperature), with_entropy,
                                               chunk_size)
    return log_probs, (entropy if with_entropy else None)
