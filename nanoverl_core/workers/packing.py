"""Padding-free micro-batches: a micro-batch's rows laid end to end, attention kept inside each row.

A padded micro-batch is a rectangle, rows x (longest prompt + longest response), and on responses of
mixed lengths most of its FLOPs multiply padding. Packed, every row's real tokens (its prompt, then its
response) follow one another in one or a few long sequences ("lines"), with `position_ids` that restart
at 0 for each row. What keeps a row from attending to the row before it depends on the model's attention
implementation:

    sdpa (every layer plain      ROWS: every row in one line, no padding at all; for the packed
    causal, not checkpointed)    forward the model's attention implementation is `row_attention`
                                 (registered with transformers' AttentionInterface), which hands each
                                 row's own queries, keys and values to sdpa, causal: attention costs
                                 the sum of the rows' squared lengths and no mask is built. With
                                 shared prompts (`share_prompts`), each distinct prompt is laid once,
                                 followed by its rows' responses, each attending to the prompt's keys
                                 and values, then causally to its own (`row_prefixes`)
    eager, flex_attention, the   LINES: transformers' masking_utils (`find_packed_sequence_indices`)
    other sdpa models            sees the positions restart and builds a block-diagonal causal mask;
                                 the cost of a line is quadratic in its length, so rows go into lines
                                 no longer than the micro-batch's longest row (first fit, longest
                                 first), each line's tail a padding segment of its own (positions 0, 1, ...)
    flash_attention_2 / 3 / 4    ONE_LINE: cu_seqlens from the positions
                                 (`prepare_fa_kwargs_from_position_ids`): varlen attention costs nothing
                                 across rows, so one line (batch 1)

ROWS switches the model's attention implementation for the length of a packed forward only
(`PackedRows.attending`); a checkpointed model would recompute its blocks in backward, outside that
switch, so it packs in LINES. A model whose attention implementation is none of these (the debug
worker's pure-torch model, remote code) cannot be packed (`packing_layout` is None). Before the first
packed pass `packing_agrees` checks on one row laid twice in one line (with shared prompts: its response
twice after its prompt) that the second copy's outputs equal the row's padded ones: a model that ignored
the positions would let the copy attend to the first.

Shapes: B rows, R' the trimmed response width (as `rows.model_inputs`), k lines of W tokens.
"""

from __future__ import annotations

import contextlib
import functools

import attrs
import torch
import torch.nn.functional as F

from ..batch import RLBatch
from ..errors import ConfigError
from .prompt_cache import checkpointed
from .rows import model_inputs

LINES, ONE_LINE, ROWS = "lines", "one line", "rows"
"""The three layouts: lines of the longest row's length (a dense mask), every row in one sequence (varlen
attention), or every row in one sequence attended row by row (`row_attention`)."""

ROW_ATTENTION = "nanoverl_rows"
"""The name `row_attention` is registered under in transformers' AttentionInterface."""


def _config(module: torch.nn.Module):
    if callable(getattr(module, "get_base_model", None)):      # peft: the transformers model under the adapter
        module = module.get_base_model()
    return getattr(module, "config", None)


def _attention_implementation(module: torch.nn.Module) -> str | None:
    return getattr(_config(module), "_attn_implementation", None)


def packing_layout(module: torch.nn.Module) -> str | None:
    """How `module` can run packed rows: ROWS (sdpa, every layer plain causal attention, no activation
    checkpointing), LINES (eager, flex_attention, other sdpa models: the mask from position_ids), ONE_LINE
    (flash attention: cu_seqlens from position_ids), or None (it cannot)."""
    name = _attention_implementation(module)
    if name == "sdpa" and _plain_causal(_config(module)) and not checkpointed(module):
        return ROWS
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


def _plain_causal(config) -> bool:
    """Whether every attention layer of a transformers `config` is plain causal attention: no sliding window
    and no logit softcapping (which `row_attention` would not apply)."""
    return all(getattr(config, key, None) is None for key in ("sliding_window", "attn_logit_softcapping")) and \
        all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])


def row_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  **kwargs) -> tuple[torch.Tensor, None]:
    """A transformers attention function (AttentionInterface) for one ROWS line: query (1, H, T, D) and key /
    value (1, H_kv, T, D) of segments laid end to end, where `cu_seq_lens_q` (S + 1,) says (without it, the
    line is one segment); `row_prefixes` (S,), where given, the segment whose keys and values a segment
    attends before its own (a prompt its rows share), or -1. Each segment attends causally to itself, after
    its prefix, through transformers' sdpa function (after a prefix, which needs an explicit mask, through
    torch's, each key / value head read by its group of query heads): one call a segment, or, where many
    segments share a length and a prefix length (short rows of a small model, where calls cost more than
    the arithmetic), one call for all of them. Returns ((1, T, H, D), None) as that function does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None or kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise ValueError("row_attention runs plain causal attention: no mask, sliding window or softcap")
    starts = kwargs.get("cu_seq_lens_q")
    lengths = tuple(torch.diff(starts).tolist()) if starts is not None else (query.shape[2],)  # without: one row
    prefixes = tuple(kwargs.get("row_prefixes") or (-1,) * len(lengths))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:     # (rows, H, L, D) each;
        before = k.shape[2] - q.shape[2]                        # k, v: a prefix's `before` positions first
        if not before or q.shape[2] == 1:
            return sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling,
                                          is_causal=not before)[0]
        # causal, aligned to the last key: an explicit mask, with which transformers' function would repeat
        # each key / value head for its query heads; torch's kernel reads them shared (enable_gqa)
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(before)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                              enable_gqa=True).transpose(1, 2)

    groups, back = _row_groups(lengths, prefixes, query.device)
    if 2 * len(groups) > len(lengths):            # most segments of a shape of their own: one call a segment
        # split, not sliced: a slice's backward fills a zero gradient as long as the line, once a segment
        qs, ks, vs = (x.split(lengths, 2) for x in (query, key, value))
        out = []
        for segment, prefix in enumerate(prefixes):
            k, v = ks[segment], vs[segment]
            if prefix >= 0:
                k, v = torch.cat([ks[prefix], k], 2), torch.cat([vs[prefix], v], 2)
            out.append(attend(qs[segment], k, v))
        return torch.cat(out, 1), None
    out = []
    for queries, keys in groups:                  # (rows, L) and (rows, P + L) token indices: one call
        q, k, v = (x[0].index_select(1, i.flatten()).unflatten(1, i.shape).transpose(0, 1)
                   for x, i in ((query, queries), (key, keys), (value, keys)))
        out.append(attend(q, k, v).flatten(0, 1))
    return torch.cat(out).index_select(0, back)[None], None


@functools.lru_cache(maxsize=16)
def _row_groups(lengths: tuple[int, ...], prefixes: tuple[int, ...], device: torch.device
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """For segments of `lengths` laid end to end, each after its prefix segment (`prefixes`, -1: none): the
    segments grouped by (length, prefix length), each group as its queries' token indices
    (rows, L) and its keys' (rows, P + L: the prefix's, then its own), on `device`; and the order that puts
    the groups' outputs back in line order. Every layer of a pass asks for the same segments: cached."""
    bounds = [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    shapes: dict[tuple[int, int], list[int]] = {}
    for segment, (length, prefix) in enumerate(zip(lengths, prefixes)):
        before = lengths[prefix] if prefix >= 0 else 0
        shapes.setdefault((length, before), []).append(segment)
    groups = []
    for segments in shapes.values():
        queries = [list(range(bounds[s], bounds[s + 1])) for s in segments]
        keys = [(list(range(bounds[p], bounds[p + 1])) if p >= 0 else []) + own
                for own, p in zip(queries, (prefixes[s] for s in segments))]
        groups.append((torch.tensor(queries, device=device), torch.tensor(keys, device=device)))
    back = torch.argsort(torch.cat([queries.flatten() for queries, _ in groups]))
    return groups, back


@contextlib.contextmanager
def _attending_rows(module: torch.nn.Module):
    """`module` attends through `row_attention` inside the block (its attention implementation switched and
    switched back): transformers builds no mask for an implementation it has no mask function for."""
    from transformers import AttentionInterface

    AttentionInterface.register(ROW_ATTENTION, row_attention)
    config = _config(module)
    before = config._attn_implementation
    config._attn_implementation = ROW_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


def attending(packed: PackedRows | None, module: torch.nn.Module) -> contextlib.AbstractContextManager:
    """`packed.attending(module)`, or nothing for a padded pass (None)."""
    return packed.attending(module) if packed is not None else contextlib.nullcontext()


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
    starts: torch.Tensor | None = None   # ROWS: (S + 1,) where each segment (a row, or a shared prompt and
                                         # each of its rows' responses) starts, then the line's end; on the
                                         # CPU, where row_attention reads it (no device sync per layer)
    prefixes: tuple[int, ...] | None = None   # ROWS with shared prompts: each segment's prompt segment, or -1

    def to(self, device: torch.device) -> PackedRows:
        tensors = (self.input_ids, self.position_ids, self.line, self.column, self.valid, self.kept)
        return PackedRows(*(t.to(device) for t in tensors), self.width, self.starts, self.prefixes)

    def inputs(self, keep_logits: bool) -> dict:
        """The module's keyword arguments: no attention_mask (the positions are the mask, see the module
        docstring; ROWS: the segments' bounds as `cu_seq_lens_q`, their prompts as `row_prefixes`);
        keep_logits: a transformers head runs on the `kept` columns only (`logits_to_keep`). Run the module
        on them inside `attending`."""
        keep = {"logits_to_keep": self.kept} if keep_logits else {}
        rows = {"cu_seq_lens_q": self.starts} if self.starts is not None else {}
        shared = {"row_prefixes": self.prefixes} if self.prefixes is not None else {}
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, **rows, **shared, **keep}

    def attending(self, module: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The context a forward of `module` on `inputs` runs in: ROWS switches its attention to
        `row_attention`; the other layouts need nothing."""
        return _attending_rows(module) if self.starts is not None else contextlib.nullcontext()

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


def _real_tokens(batch: RLBatch) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Each row's real prompt and response tokens (prompts left-padded, responses right-padded: batch.py),
    and R'."""
    prompt_mask, response_mask = batch["prompt_mask"].bool(), batch["response_mask"].bool()
    if not prompt_mask.any(-1).all():
        raise ValueError("a row without a prompt token cannot be packed: its first response token has no "
                         "position predicting it")
    width = int(response_mask.any(0).nonzero()[-1]) + 1 if response_mask.any() else 1
    return [p[m] for p, m in zip(batch["prompts"], prompt_mask)], \
        [r[n] for r, n in zip(batch["responses"], response_mask)], width


def pack_rows(batch: RLBatch, layout: str, pad_token_id: int = 0, share_prompts: bool = False) -> PackedRows:
    """The rows of `batch` packed in `layout`.

    Every row keeps its real tokens only (prompt_mask, response_mask), positions 0 .. p + r - 1, as the
    padded path's attention mask and positions see them. LINES: lines of the longest row's length, rows
    placed first-fit longest first (ties in row order); ONE_LINE and ROWS: one line in row order.
    ROWS with share_prompts: `_pack_shared`.
    """
    if layout == ROWS and share_prompts:
        return _pack_shared(batch)
    prompts, responses, width = _real_tokens(batch)
    rows = [torch.cat(pair) for pair in zip(prompts, responses)]
    lengths = [len(row) for row in rows]
    lines = _lines(lengths, layout)
    capacity = max(lengths) if layout == LINES else sum(lengths)
    ids = torch.full((len(lines), capacity), pad_token_id, dtype=torch.long)
    pos = torch.zeros((len(lines), capacity), dtype=torch.long)
    line = torch.zeros((len(rows), width), dtype=torch.long)
    column = torch.zeros((len(rows), width), dtype=torch.long)
    for i, members in enumerate(lines):
        start = 0
        for b in members:
            ids[i, start:start + lengths[b]] = rows[b]
            pos[i, start:start + lengths[b]] = torch.arange(lengths[b])
            line[b] = i
            # the output at a row's position t predicts its token t + 1: response token j is predicted at p + j - 1
            column[b] = start + len(prompts[b]) - 1 + torch.arange(width).clamp(max=len(responses[b]) - 1).clamp(min=0)
            start += lengths[b]
        pos[i, start:] = torch.arange(capacity - start)            # the tail: a segment of its own
    valid = batch["response_mask"][:, :width].bool()
    starts = torch.tensor([0, *lengths]).cumsum(0) if layout == ROWS else None
    return PackedRows(ids, pos, line, column, valid, torch.unique(column[valid]), width, starts)


def _pack_shared(batch: RLBatch) -> PackedRows:
    """ROWS, each distinct prompt once: in one line, every distinct prompt (in order of first appearance) then
    the responses of the rows that share it, each a segment of its own at positions p .. p + r - 1 that
    attends to its prompt's segment, then causally to itself (`row_prefixes`). A response token j >= 1 is
    predicted in its row's segment, token 0 at its prompt's last position (autograd sums that position's
    gradient over the prompt's rows)."""
    prompts, responses, width = _real_tokens(batch)
    shared: dict[tuple[int, ...], list[int]] = {}
    for b, prompt in enumerate(prompts):
        shared.setdefault(tuple(prompt.tolist()), []).append(b)
    ids, pos, lengths, prefixes = [], [], [], []
    end = 0

    def lay(tokens: torch.Tensor, first: int, prefix: int) -> int:
        """Append a segment at positions first, first + 1, ...; return where it starts."""
        nonlocal end
        ids.append(tokens)
        pos.append(torch.arange(first, first + len(tokens)))
        lengths.append(len(tokens))
        prefixes.append(prefix)
        end += len(tokens)
        return end - len(tokens)

    column = torch.zeros((len(prompts), width), dtype=torch.long)
    for members in shared.values():
        prompt, segment = prompts[members[0]], len(lengths)
        last = lay(prompt, 0, -1) + len(prompt) - 1
        for b in members:
            j = torch.arange(width).clamp(max=max(len(responses[b]) - 1, 0))
            start = lay(responses[b], len(prompt), segment) if len(responses[b]) else 0   # empty: no segment
            column[b] = torch.where(j == 0, last, start + j - 1)
    valid = batch["response_mask"][:, :width].bool()
    return PackedRows(torch.cat(ids)[None], torch.cat(pos)[None], torch.zeros_like(column), column, valid,
                      torch.unique(column[valid]), width, torch.tensor([0, *lengths]).cumsum(0), tuple(prefixes))


def _lines(lengths: list[int], layout: str) -> list[list[int]]:
    """The rows of each line: ONE_LINE and ROWS, all in row order; LINES, first fit into lines of the longest
    row's length, longest row first (ties in row order)."""
    if layout != LINES:
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
    return len(_lines(lengths, layout)) * max(lengths) if layout == LINES else sum(lengths)


def shared_cost(batch: RLBatch) -> int:
    """Tokens the shared-prompt path (workers/prompt_cache.py) runs on `batch`: each distinct prompt but its
    last token once, padded to the longest, then every row from its prompt's last token, padded to the
    longest response."""
    ids, mask, _, width = model_inputs(batch)
    split = ids.shape[1] - width - 1
    distinct = torch.unique(torch.cat([ids[:, :split], mask[:, :split]], 1), dim=0).shape[0]
    return distinct * split + len(batch) * (width + 1)


@torch.no_grad()
def packing_agrees(module: torch.nn.Module, batch: RLBatch, device: torch.device, layout: str,
                   share_prompts: bool = False) -> bool:
    """Whether packed rows really cannot see each other in `module`: the longest row of `batch` laid twice in
    one line gives, in its second copy, the outputs of its padded forward (float32 1e-4, half 5e-2), in the
    weights' own dtype with autocast off, packed in `layout`'s way: LINES and ONE_LINE read the same
    positions, so one line checks either; ROWS checks its own attention (share_prompts: the two copies'
    responses after their one prompt).
    The random streams are left as they were: the check runs at the first packed pass, which a resumed run
    meets at another step."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            torch.autocast(device.type, enabled=False):       # the weights' own dtype: positions, not rounding
        return _packing_agrees(module, batch, device, layout, share_prompts)


def _packing_agrees(module: torch.nn.Module, batch: RLBatch, device: torch.device, layout: str,
                    share_prompts: bool) -> bool:
    row = int(batch["response_mask"].sum(-1).argmax())           # the longest response: the most to compare
    one = batch.index([row])
    packed = pack_rows(batch.index([row, row]), ROWS if layout == ROWS else ONE_LINE,
                       share_prompts=share_prompts).to(device)
    with packed.attending(module):
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
