"""Plain texts as a batch's responses, so they are scored the one way a rollout's are (`score_batch`):
what `nanoverl-train score` and `nanoverl_core.testing.score_texts` do."""

from __future__ import annotations

import torch

from ..batch import RLBatch


class ByteTokenizer:
    """Text as its UTF-8 bytes, one token each (ids 1-256; 0 pads): what `as_responses` encodes with."""

    pad_token_id = eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + 1 for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - 1 for i in ids if i).decode()


def as_responses(batch: RLBatch, texts: list[str]) -> RLBatch:
    """`batch` (its rows: prompt_text, row, index, data_source) with `texts` as its responses and
    response_mask, `ByteTokenizer` tokens; decoding them with a ByteTokenizer gives `texts` back."""
    tokens = [ByteTokenizer().encode(text) for text in texts]
    responses = torch.zeros((len(texts), max([len(t) for t in tokens] + [1])), dtype=torch.long)
    for row, ids in enumerate(tokens):
        responses[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return RLBatch({**batch.tensors, "responses": responses, "response_mask": (responses > 0).long()},
                   batch.non_tensors)
