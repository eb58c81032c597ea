"""Padding-free micro-batches: a micro-batch's rows laid end to end, attention kept inside each row.

A padded micro-batch is a rectangle, rows x (longest prompt + longest response), and on responses of
mixed lengths most of its FLOPs multiply padding. Packed, every row's real tokens (its prompt, then its
response) follow one another in a few long sequences ("lines"), with `position_ids` that restart at 0
for each row and no `attention_mask`. What keeps a row from attending to the row before it is the
model's attention implementation, reading those positions:

    eager, sdpa, flex_attention   transformers' masking_utils (`find_packed_sequence_indices`) sees the
                                  positions restart and builds a block-diagonal causal mask; the cost
                                  of a line is quadratic in its length, so rows go into lines no
                                  longer than the micro-batch's longest row (first fit, longest first),
                                  each line's tail a padding segment of its own (positions 0, 1, ...)
    flash_attention_2 / 3 / 4     cu_seqlens from the positions (`prepare_fa_kwargs_from_position_ids`):
                                  varlen attention costs nothing across rows, so one line (batch 1)

A model whose attention implementation is none of these (the debug worker's pure-torch model, remote
code) cannot be packed (`packing_layout` is None). Before the first packed pass `packing_agrees`
checks on one row laid twice in one line that the second copy's outputs equal the row's padded ones:
a model that ignored the positions would let the copy attend to the first.

Shapes: B rows, R' the trimmed response width (as `rows.model_inputs`), k lines of W tokens.
"""

from __future__ import annotations

import attrs
import torch

from ..batch import RLBatch
from ..errors import ConfigError
from .rows import model_inputs

LINES, ONE_LINE = "lines", "one line"
"""The two layouts: lines of the longest row's length (a dense mask), or every row in one sequence (varlen)."""


def _attention_implementation(module: torch.nn.Module) -> str | None:
    if callable(getattr(module, "get_base_model", None)):      # peft: the transformers model under the adapter
        module = module.get_base_model()
    config = getattr(module, "config", None)
    return getattr(config, "_attn_implementation", None)


def packing_layout(module: torch.nn.Module) -> str | None:
    """How `module` can run packed rows: LINES (eager, sdpa, flex_attention: the mask from position_ids),
    ONE_LINE (flash attention: cu_seqlens from position_ids), or None (it cannot)."""
    name = _attention_implementation(module)
    if name in ("eager", "sdpa", "flex_attention"):
        return LINES
    if isinstance(name, str) and name.startswith("flash_attention"):
        return ONE_LINE
    return None


def packing_for(module: torch.nn.Module, pack: bool | str, key: str) -> str | None:
    """The layout a worker packs in: `pack` is the worker's setting (`key`, e.g. actor.pack): "auto" packs
    when the model can, True must (else a ConfigError naming the key), False never."""
    layout = packing_layout(module) if pack is not False else None
    if pack is True and layout is None:
        name = _attention_implementation(module)
        raise ConfigError(f"{key} = true, but {type(module).__name__} cannot run packed rows (attention "
                          f"{name or 'that reads no position_ids'}: packing needs a transformers model with eager, "
                          f"sdpa, flex_attention or flash_attention_*); set {key} = \"auto\" or false")
    return layout


@attrs.frozen
class PackedRows:
    """A micro-batch's rows packed into k lines, and where each response token's prediction is."""

    input_ids: torch.Tensor      # (k, W) every row's real prompt then response tokens; line tails padded
    position_ids: torch.Tensor   # (k, W) 0, 1, ... within each row (and within each line's padded tail)
    line: torch.Tensor           # (B, R') the line holding row b's position predicting response token j
    column: torch.Tensor         # (B, R') that position's column in its line
    valid: torch.Tensor          # (B, R') bool, response_mask: the tokens that exist
    kept: torch.Tensor           # (K,) sorted: the columns holding any predicting position
    width: int                   # R'

    def to(self, device: torch.device) -> PackedRows:
        return PackedRows(*(t.to(device) for t in (self.input_ids, self.position_ids, self.line, self.column,
                                                  self.valid, self.kept)), self.width)

    def inputs(self, keep_logits: bool) -> dict:
        """The module's keyword arguments: no attention_mask (the positions are the mask, see the module
        docstring); keep_logits: a transformers head runs on the `kept` columns only (`logits_to_keep`)."""
        keep = {"logits_to_keep": self.kept} if keep_logits else {}
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, **keep}

    def pick(self, out: torch.Tensor, kept: bool = False) -> torch.Tensor:
        """(k, W, ...) outputs (or (k, K, ...), `kept` columns only) -> (B, R', ...) at each response token's
        predicting position; on padding, whatever some position of the row holds: mask it."""
        return out[self.line, torch.searchsorted(self.kept, self.column) if kept else self.column]

    def pick_valid(self, out: torch.Tensor, kept: bool = False) -> torch.Tensor:
        """As `pick`, at the valid response tokens only: (N, ...) in the row-major order of `valid`."""
        column = self.column[self.valid]
        return out[self.line[self.valid], torch.searchsorted(self.kept, column) if kept else column]


def row_lengths(batch: RLBatch) -> tuple[list[int], list[int]]:
    """Each row's real prompt and response token counts."""
    return batch["prompt_mask"].sum(-1).tolist(), batch["response_mask"].sum(-1).long().tolist()


def pack_rows(batch: RLBatch, layout: str, pad_token_id: int = 0) -> PackedRows:
    """The rows of `batch` (prompts left-padded, responses right-padded: batch.py) packed in `layout`.

    Every row keeps its real tokens only (prompt_mask, response_mask), positions 0 .. p + r - 1, as the
    padded path's attention mask and positions see them. LINES: lines of the longest row's length, rows
    placed first-fit longest first (ties in row order); ONE_LINE: one line in row order.
    """
    prompt_mask, response_mask = batch["prompt_mask"].bool(), batch["response_mask"].bool()
    rows = [torch.cat([p[m], r[n]]) for p, m, r, n in zip(batch["prompts"], prompt_mask, batch["responses"],
                                                           response_mask)]
    prompts, _ = row_lengths(batch)
    if min(prompts) < 1:
        raise ValueError("a row without a prompt token cannot be packed: its first response token has no "
                         "position predicting it")
    lengths = [len(row) for row in rows]
    lines = _lines(lengths, layout)
    capacity = sum(lengths) if layout == ONE_LINE else max(lengths)
    ids = torch.full((len(lines), capacity), pad_token_id, dtype=torch.long)
    pos = torch.zeros((len(lines), capacity), dtype=torch.long)
    width = int(response_mask.any(0).nonzero()[-1]) + 1 if response_mask.any() else 1
    line = torch.zeros((len(rows), width), dtype=torch.long)
    column = torch.zeros((len(rows), width), dtype=torch.long)
    for i, members in enumerate(lines):
        start = 0
        for b in members:
            ids[i, start:start + lengths[b]] = rows[b]
            pos[i, start:start + lengths[b]] = torch.arange(lengths[b])
            line[b] = i
            # the output at a row's position t predicts its token t + 1: response token j is predicted at p + j - 1
            column[b] = start + prompts[b] - 1 + torch.arange(width).clamp(max=lengths[b] - prompts[b] - 1).clamp(min=0)
            start += lengths[b]
        pos[i, start:] = torch.arange(capacity - start)            # the tail: a segment of its own
    valid = response_mask[:, :width].clone()
    return PackedRows(ids, pos, line, column, valid, torch.unique(column[valid]), width)


def _lines(lengths: list[int], layout: str) -> list[list[int]]:
    """The rows of each line: ONE_LINE, all in row order; LINES, first fit into lines of the longest row's
    length, longest row first (ties in row order)."""
    if layout == ONE_LINE:
        return [list(range(len(lengths)))]
    lines: list[list[int]] = []
    room: list[int] = []
    for b in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fit = next((i for i, free in enumerate(room) if free >= lengths[b]), None)
        if fit is None:
            lines.append([])
            room.append(max(lengths))
            fit = len(lines) - 1
        lines[fit].append(b)
        room[fit] -= lengths[b]
    return lines


def packed_cost(batch: RLBatch, layout: str) -> int:
    """Tokens a packed pass of `batch` runs: the real ones, and for LINES the lines' padded tails."""
    lengths = [p + r for p, r in zip(*row_lengths(batch))]
    return sum(lengths) if layout == ONE_LINE else len(_lines(lengths, layout)) * max(lengths)


def shared_cost(batch: RLBatch) -> int:
    """Tokens the shared-prompt path (workers/prompt_cache.py) runs on `batch`: each distinct prompt but its
    last token once, padded to the longest, then every row from its prompt's last token, padded to the
    longest response."""
    ids, mask, _, width = model_inputs(batch)
    split = ids.shape[1] - width - 1
    distinct = torch.unique(torch.cat([ids[:, :split], mask[:, :split]], 1), dim=0).shape[0]
    return distinct * split + len(batch) * (width + 1)


@torch.no_grad()
def packing_agrees(module: torch.nn.Module, batch: RLBatch, device: torch.device) -> bool:
    """Whether packed rows really cannot see each other in `module`: the first row of `batch` laid twice in
    one line gives, in its second copy, the outputs of its padded forward (float32 1e-4, half 5e-2), in the
    weights' own dtype with autocast off. Both layouts read the same positions, so one line checks either.
    The random streams are left as they were: the check runs at the first packed pass, which a resumed run
    meets at another step."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            torch.autocast(device.type, enabled=False):       # the weights' own dtype: positions, not rounding
        return _packing_agrees(module, batch, device)


def _packing_agrees(module: torch.nn.Module, batch: RLBatch, device: torch.device) -> bool:
    row = int(batch["response_mask"].sum(-1).argmax())           # the longest response: the most to compare
    one = batch.index([row])
    packed = pack_rows(batch.index([row, row]), ONE_LINE).to(device)
    out = module(**packed.inputs(keep_logits=False)).logits
    got = packed.pick(out)[1]                                     # the second copy: (R', V)
    mask = torch.cat([one["prompt_mask"], one["response_mask"][:, :packed.width].to(one["prompt_mask"].dtype)], 1)
    ids = torch.cat([one["prompts"], one["responses"][:, :packed.width]], 1).to(device)
    mask = mask.to(device)
    plain = module(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    want = plain[0, -packed.width - 1:-1]
    valid = packed.valid[0]
    tol = 1e-4 if want.dtype in (torch.float32, torch.float64) else 5e-2
    return bool(torch.allclose(got[valid].float(), want[valid].float(), rtol=tol, atol=tol))
