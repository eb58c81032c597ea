"""The actor's log-probs through its LM head without the (positions, vocabulary) logits.

`ChunkedHead` runs a transformers causal LM's own forward with a forward pre-hook on its output
head (`module.get_output_embeddings()`, a plain nn.Linear): the hook takes the hidden states the
model hands its head, computes the response tokens' log-probs (and entropy) from them with
`algos.logprobs_from_hidden`, and lets the head itself run on one position only. Hooking the head,
rather than calling the model's body, keeps everything the full forward sets up: peft's LoRA
layers (and `disable_adapter()` for a LoRA reference), FSDP2's unshard of the root unit (the
head's weight is the gathered tensor while the hook runs, as it is for the head's own forward),
gradient checkpointing of the blocks.

A model that changes its logits after the head (Gemma-2's soft-capping, a logit scale) would be
wrong this way, so before the first use a no-grad forward of one token checks that the model's
logits are its head's plain product; when they are not, or when the hook cannot see the positions it
expects, `__call__` returns None and the actor keeps the full-logits path from then on. Both depend
only on the model, so every FSDP rank decides alike (each forward is a collective there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..algos import logprobs_from_hidden


class ChunkedHead:
    """The output head of `module` evaluated in chunks of positions (see the module docstring)."""

    def __init__(self, head: torch.nn.Linear, chunk_size: int, compiled: bool = False):
        self.head, self.chunk_size, self.compiled = head, chunk_size, compiled
        """compiled: the arithmetic after each chunk's product through torch.compile (`model.compile`)."""
        self.checked = False
        """Whether the model's logits were found to be the head's plain product (before the first call)."""

    @classmethod
    def of(cls, module: torch.nn.Module, chunk_size: int, compiled: bool = False) -> ChunkedHead | None:
        """A ChunkedHead when `module` has a plain nn.Linear output head and chunking is on, else None."""
        get = getattr(module, "get_output_embeddings", None)
        head = get() if chunk_size > 0 and callable(get) else None
        return cls(head, chunk_size, compiled) if type(head) is torch.nn.Linear else None   # not peft's LoRA head

    def __call__(self, module: torch.nn.Module, inputs: dict, labels: torch.Tensor, valid: torch.Tensor,
                 temperature: float, with_entropy: bool, pick: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """module(**inputs) with the head replaced; labels, valid: (B, R') response ids and mask.

        pick: the head's input (k, T', H) -> (N, H) at the positions predicting the valid tokens, in the
        row-major order of `valid`, for packed rows (`PackedRows.pick_valid`); None: the padded layout,
        whose last R' + 1 positions predict the response.
        Returns (log_probs, entropy or None), each (B, R') float32 and 0 where `valid` is False (only
        valid positions go through the head), or None when this model cannot be served this way.
        """
        if not self.checked:
            if not self._logits_are_the_heads_product(module, inputs["input_ids"][:1, -1:]):
                return None
            self.checked = True
        width = labels.shape[1]
        out: dict = {}

        def padded(hidden: torch.Tensor) -> torch.Tensor | None:
            if hidden.shape[0] != labels.shape[0] or hidden.shape[1] < width + 1:
                return None
            # the head's input at position t predicts token t + 1: the last R' + 1 positions but the last
            return hidden[:, -width - 1:-1][valid]

        def hook(head: torch.nn.Module, args: tuple):
            hidden = args[0] if len(args) == 1 else None       # (B, T', H), T' = R' + 1 with logits_to_keep
            weight = head.weight
            if out or hidden is None or hidden.dim() != 3 or hasattr(weight, "full_tensor"):  # a DTensor: sharded
                return None
            picked = (pick or padded)(hidden)                                          # (N, H), N valid tokens
            if picked is None:
                return None
            out["scores"] = logprobs_from_hidden(picked, weight, labels[valid], head.bias, temperature=temperature,
                                                 with_entropy=with_entropy, chunk_size=self.chunk_size,
                                                 compiled=self.compiled)
            return (hidden[:, -1:],)          # the head's own product at one position, (B, 1, V), unused

        handle = self.head.register_forward_pre_hook(hook)
        try:
            module(**inputs)
        finally:
            handle.remove()
        if "scores" not in out:
            return None
        log_probs, entropy = out["scores"]
        return _scatter(log_probs, valid), (_scatter(entropy, valid) if entropy is not None else None)

    @torch.no_grad()
    def _logits_are_the_heads_product(self, module: torch.nn.Module, ids: torch.Tensor) -> bool:
        """module(input_ids=ids).logits == head(its input), ids (1, 1): nothing transforms the logits after the head."""
        seen = {}

        def hook(head: torch.nn.Module, args: tuple):
            seen["product"] = F.linear(args[0], head.weight, head.bias) if len(args) == 1 else None

        handle = self.head.register_forward_pre_hook(hook)
        try:
            logits = module(input_ids=ids).logits
        finally:
            handle.remove()
        product = seen.get("product")
        return product is not None and product.shape == logits.shape and \
            torch.allclose(logits.float(), product.float(), rtol=1e-4, atol=1e-5)


def _scatter(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(N,) values at the True positions of valid (B, R') -> (B, R') float32, 0 elsewhere (differentiable)."""
    full = values.new_zeros(valid.shape, dtype=torch.float32)
    return full.masked_scatter(valid, values.float())
