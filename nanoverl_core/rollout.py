"""What a rollout engine receives and returns.

A rollout plugin registers ``make_rollout(config, workers) -> Rollout`` (``nanoverl_core.protocols``).
The trainer hands it a batch whose rows are already repeated ``rollout.n`` times (rows of one prompt share a ``uid``) and holding
``prompts`` / ``prompt_mask`` (left-padded, ``(B, P)``). ``generate`` returns a batch with the same
rows in the same order holding ``responses`` and ``response_mask`` (``(B, R)``, right-padded; the mask
covers every token the rollout produced, up to and including EOS, and keeps that meaning for the whole
step), ``truncated`` (``(B,)`` bool: the row ended without a stop token), built with
``responses_to_batch`` so every engine builds them the same way, and optionally ``rollout_log_probs``.
Each column's meaning: nanoverl_core.batch. A rollout never writes ``loss_mask`` (the trainer derives it);
a multi-turn episode adds ``model_mask`` and its other columns (nanoverl_core.env.episode). An agent's
episode may answer its row with several consecutive rows, each naming it in ``episode_row`` (``rollout_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from .batch import RLBatch, is_episodes
from .errors import PluginError


@attrs.frozen
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_seeds(rows: int) -> torch.Tensor:
    """(rows,) int64 per-row sampling seeds: one draw from torch's global generator plus the row index,
    so rows that share a prompt get different samples and a run seeded by trainer.seed repeats itself."""
    return int(torch.randint(0, 2**31, ())) + torch.arange(rows)


def stop_token_ids(tokenizer, module=None) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS, then those of the module's generation config
    (chat models often end a turn with a token such as <|im_end|> besides the tokenizer's EOS)."""
    ids = [tokenizer.eos_token_id]
    extra = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
    for value in ([extra] if isinstance(extra, int) else list(extra or [])):
        if value not in ids:
            ids.append(value)
    return ids


def responses_to_batch(responses: Sequence[Sequence[int]] | torch.Tensor, *, eos_token_id: int | Sequence[int],
                       pad_token_id: int, max_new_tokens: int,
                       log_probs: Sequence[Sequence[float]] | None = None) -> RLBatch:
    """Right-pad generated token lists into ``responses`` / ``response_mask`` (B, R) and ``truncated`` (B,).

    Each list is cut after its first EOS (kept, and covered by the mask) and at ``max_new_tokens``; a
    row whose kept tokens hold no EOS is ``truncated`` (cut at the budget, or stopped by the engine).
    R is the longest kept response, so a batch that stopped early is not padded to the budget.
    ``responses`` may also be a (B, R) tensor of generated ids (whatever follows an EOS is ignored).
    """
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    if isinstance(responses, torch.Tensor) and log_probs is None and responses.shape[1] > 0:
        return _tensor_responses_to_batch(responses, eos, pad_token_id, max_new_tokens)
    kept: list[list[int]] = []
    truncated: list[bool] = []
    for tokens in responses:
        tokens = list(tokens)[:max_new_tokens]
        stop = next((i for i, tok in enumerate(tokens) if tok in eos), None)
        kept.append(tokens if stop is None else tokens[: stop + 1])
        truncated.append(stop is None)
    width = max(1, max(len(t) for t in kept))
    ids = torch.full((len(kept), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(kept), width), dtype=torch.float32)
    for row, tokens in enumerate(kept):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, : len(tokens)] = 1.0
    out = RLBatch({"responses": ids, "response_mask": mask, "truncated": torch.tensor(truncated, dtype=torch.bool)})
    if log_probs is not None:
        lp = torch.zeros((len(kept), width), dtype=torch.float32)
        for row, (tokens, values) in enumerate(zip(kept, log_probs)):
            lp[row, : len(tokens)] = torch.tensor(list(values)[: len(tokens)], dtype=torch.float32)
        out["rollout_log_probs"] = lp
    return out


def _tensor_responses_to_batch(responses: torch.Tensor, eos: set[int], pad_token_id: int,
                               max_new_tokens: int) -> RLBatch:
    """responses_to_batch for a (B, R) tensor of generated ids, without a Python loop over rows."""
    ids = responses[:, :max_new_tokens].cpu()
    is_eos = torch.isin(ids, torch.tensor(sorted(eos), dtype=ids.dtype))
    ended = is_eos.any(-1)                                                                 # (B,)
    lengths = torch.where(ended, is_eos.int().argmax(-1) + 1, ids.shape[1])               # (B,) up to the first EOS
    width = max(1, int(lengths.max()))
    mask = torch.arange(width) < lengths[:, None]                                          # (B, width)
    ids = torch.where(mask, ids[:, :width], torch.full_like(ids[:, :width], pad_token_id))
    return RLBatch({"responses": ids.long(), "response_mask": mask.float(), "truncated": ~ended})


def check_rollout_columns(out: RLBatch, name: str) -> RLBatch:
    """`out` (what rollout `name` generated), refused with one line where it follows the 0.1.0 contract
    (CHANGELOG.md): a `loss_mask` column (its model's tokens are `model_mask` now; the trainer alone derives
    loss_mask), or no `truncated` column."""
    if "truncated" not in out:
        raise PluginError(f"rollout.name = {name!r} returned no 'truncated' column; since nanoverl 0.2.0 a rollout "
                          "returns truncated (B,) bool, True for a row that ended without a stop token: build its "
                          "output with nanoverl_core.responses_to_batch, or add the column (CHANGELOG.md)")
    if "loss_mask" in out:
        raise PluginError(f"rollout.name = {name!r} returned a 'loss_mask' column; since nanoverl 0.2.0 a rollout "
                           "reports the tokens its model sampled as 'model_mask' (1 on the model's tokens, 0 on an "
                           "environment's) and the trainer derives loss_mask: rename the column (CHANGELOG.md)")
    return out


def rollout_rows(batch: RLBatch, out: RLBatch, *, split_rows: bool) -> RLBatch:
    """`batch` with the columns a rollout generated for it (`out`). A rollout may return several rows for one
    input row, each naming it in `episode_row` (an agent's episode whose calls did not all extend one another:
    nanoverl_core.agents.rollout). In training (`split_rows`) the input row is repeated for each, so every one
    joins its group (uid) and the loss; elsewhere (validation, eval, a greedy baseline: one answer a sample)
    each input row takes its last row, the episode's end."""
    if "episode_row" in out and len(out) != len(batch):
        source = out["episode_row"].tolist()
        if split_rows:
            batch = batch.index(source)
        else:
            out = out.index([i for i in range(len(out)) if i + 1 == len(out) or source[i + 1] != source[i]])
    batch.update(out)
    return batch


def decode_responses(tokenizer, batch: RLBatch) -> list[str]:
    """Each row's response text: its valid tokens (the mask is a prefix) decoded without special tokens;
    for a multi-turn episode the last model turn's text (`final_text`, what [reward] scores)."""
    if is_episodes(batch):
        return list(batch["final_text"])
    lengths = batch["response_mask"].sum(-1).int().tolist()
    rows = [ids[:n] for ids, n in zip(batch["responses"].tolist(), lengths)]
    batch_decode = getattr(tokenizer, "batch_decode", None)  # one call for the batch (HF)
    if batch_decode is not None:
        return batch_decode(rows, skip_special_tokens=True)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in rows]
