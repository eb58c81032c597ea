"""How a micro-batch reaches the model: `ForwardPass`, the one object a worker runs its forwards through.

A `TorchActor` asks it for log-probs (and entropy, sum pi^2, or the top-k tokens' or given tokens' log-probs),
a `TorchCritic` for values; the PPO mechanics (workers/ppo.py) never see how the rows were laid out. Four
choices, made once:

    layout     padded rows (a rectangle, rows x (longest prompt + longest response)) or packed rows, end
               to end (workers/packing.py): LINES, ONE_LINE or ROWS, by the model's attention (`actor.pack`)
    prompts    each distinct prompt once (`actor.share_prompts`): laid once in the packed line (ROWS), or
               run once through a KV cache every row continues from (workers/prompt_cache.py); or every
               row whole
    head       a policy's response log-probs through its LM head a chunk of positions at a time
               (workers/lm_head.py, `actor.logits_chunk_size`), or from the full logits; a value head whole
    precision  `model.compute_dtype`'s autocast (workers/precision.py), each weight cast once per pass

The constructor decides them from the config and the model (its attention implementation, its forward's
keywords, its head's type). Three checks run once, on the first pass that would use what they check, and
can turn a choice off for the rest of the run: packed rows cannot see each other (`packing_agrees`), the
prompt cache gives a plain pass's outputs (`_prompt_cache_agrees`), the logits are the head's plain
product (`ChunkedHead`). `describe` says the choices in words; `--dry-run` prints what the config asks
for (`planned`), and a change is one line on stderr naming the key, the reason and the passes from then on.
The check runs before the pass that meets it is laid out, so that pass takes the path every later one
takes (a resumed run meets it at another step than the unbroken run and computes what it computed).

Per micro-batch two rules remain, each a function of the batch, never of the passes before it: with
LINES or ONE_LINE and shared prompts, the pass runs through the prompt cache when that runs fewer tokens
(all ranks summed); a training pass whose backward cannot go through a cache (gradient checkpointing,
FSDP), or one where some rank's prompts are a single token, runs every row whole.

Module conventions: ``module(input_ids=, attention_mask=, position_ids=)`` returns an object with
``.logits``: ``(B, T, V)`` for a policy, ``(B, T, 1)`` for a value model. Shapes: B rows, R the batch's
response width, R' the trimmed one (`rows.model_inputs`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any

import torch

from ..algos import entropy_from_logits, logprobs_from_logits, sum_pi_squared_from_logits
from ..batch import RLBatch
from ..config import ActorConfig, Config, CriticConfig
from ..errors import ConfigError
from .compile import compile_blocks
from .lm_head import ChunkedHead
from .packing import (LINES, ONE_LINE, ROWS, PackedRows, attending, pack_rows, packed_cost, packing_agrees,
                      packing_for, shared_cost)
from .precision import autocast, autocast_dtype, warn_slow_compute_dtype
from .prompt_cache import cache_keyword, checkpointed, forward_keyword, prompt_cache
from .rows import model_inputs
from .strategies import DataParallel, Weights

LAYOUTS = {None: "padded rows", LINES: "packed in lines of the longest row's length",
           ONE_LINE: "packed in one line", ROWS: "packed in one line, attended row by row"}


class ForwardPass:
    """The forward passes of one worker's module (see the module docstring).

    key: the worker's config section ("actor", "critic"), which messages name; policy: log-probs through an
    LM head (actor, reference), else values; trainable: the worker's optimizer steps (casts kept per step)."""

    def __init__(self, module: torch.nn.Module, config: Config, section: ActorConfig | CriticConfig, *, key: str,
                 policy: bool, trainable: bool, device: torch.device, parallel: DataParallel, weights: Weights):
        self.module, self.config, self.section, self.key, self.policy = module, config, section, key, policy
        self.device, self.parallel, self.weights = device, parallel, weights
        self.packing = packing_for(module, section.pack, f"{key}.pack")
        """The layout a micro-batch is packed in (workers/packing.py), or None: padded."""
        self.cache_keyword = cache_keyword(module) if section.share_prompts else None
        """The forward's KV-cache keyword when prompts are shared through a cache; None: every row runs whole."""
        self.keeps_logits = policy and forward_keyword(module, "logits_to_keep") is not None
        """A policy's transformers head runs on the predicting positions only (logits_to_keep): the prompt's
        (B, P, V) logits are never needed, and at a real vocabulary they are most of the head's cost."""
        self.head = ChunkedHead.of(module, config.actor.logits_chunk_size, compiled=config.model.compile) \
            if policy else None
        """The LM head a chunk of positions at a time, or None: the full logits (or a value head)."""
        self.keeps_casts = trainable and bool(autocast_dtype(config.model)) and \
            not config.model.gradient_checkpointing and not any(hasattr(p, "full_tensor") for p in module.parameters())
        """Whether `casts_once` keeps autocast's weight casts over a pass's micro-batches (see there; autocast
        keeps none of a frozen worker's weights)."""
        self.checked: set[str] = set()
        """The one-time checks that ran: "pack", "share_prompts" (the head's is the ChunkedHead's own)."""
        if device.type == "cpu" and autocast_dtype(config.model):
            warn_slow_compute_dtype(autocast_dtype(config.model))
        if config.model.compile:
            compile_blocks(module, device)

    def describe(self) -> str:
        """The choices in words, as a change is logged."""
        in_line = self.packing == ROWS and self.section.share_prompts
        prompts = ("each distinct prompt once in the line" if in_line else
                   "each distinct prompt once through a KV cache" if self.cache_keyword else "every row whole")
        head = f"the LM head {self.head.chunk_size} positions at a time" if self.head else "the full logits"
        dtype = autocast_dtype(self.config.model)
        return "; ".join([LAYOUTS[self.packing], prompts, head if self.policy else "the value head",
                          f"autocast to {dtype}" if dtype else self.config.model.dtype])

    def _turn_off(self, key: str, why: str) -> None:
        """A check found `key` wrong for this model: off for the rest of the run, one line on stderr."""
        if key == "pack":
            self.packing = None
        elif key == "share_prompts":
            self.cache_keyword = None
        else:
            self.head = None
        print(f"warning: {type(self.module).__name__}: {why}; {self.key}.{key} is off for this run (its passes "
              f"from now on: {self.describe()})", file=sys.stderr)

    # ---- precision -------------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """A fresh context for one forward pass: `model.compute_dtype`'s autocast on the device, or nothing.
        Backward runs outside it, as torch.autocast asks: each op's gradient in its forward's dtype."""
        return autocast(self.config.model, self.device)

    def casts_once(self) -> contextlib.AbstractContextManager:
        """Around the micro-batches of one optimizer step or one log-prob pass: under `model.compute_dtype`,
        each weight is cast once for all of them instead of once per micro-batch. torch.autocast keeps its
        casts of weights that require gradients until its outermost region ends; this is that region, with
        autocast off (the forwards open their own inside it; losses and backward run outside autocast, as
        without it). The kept casts are the very tensors each micro-batch would make, so results are bitwise
        the same. Not for sharded weights (FSDP gathers and frees them block by block: kept casts would hold
        the whole model) or under gradient checkpointing (its blocks are recomputed in backward)."""
        return torch.autocast(self.device.type, enabled=False) if self.keeps_casts else contextlib.nullcontext()

    # ---- what a pass computes --------------------------------------------------------------------------
    def log_probs(self, batch: RLBatch, temperature: float, with_entropy: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, R) log-probs of the response tokens at `temperature`, and (B, R) entropy or None; 0 on
        padding. The module runs under autocast; log-softmax and entropy take float32 logits."""
        with self.autocast(), contextlib.ExitStack() as stack:
            inputs, width, packed = self.lay_out(batch)
            stack.enter_context(attending(packed, self.module))
            responses = batch["responses"][:, :width].to(self.device)             # (B, R')
            valid = batch["response_mask"][:, :width].to(self.device).bool()
            scores = self._through_head(inputs, responses, valid, temperature, with_entropy, packed) \
                if self.head is not None else None
            logits = self._logits(inputs, width, packed, temperature) if scores is None else None
        if scores is None:
            scores = logprobs_from_logits(logits, responses), (entropy_from_logits(logits) if with_entropy else None)
            if packed is not None:                # padding positions of packed rows hold another token's scores
                scores = tuple(x.masked_fill(~valid, 0) if x is not None else None for x in scores)
        log_probs, entropy = scores
        full = batch["responses"].shape[1]
        return _pad_right(log_probs, full), (_pad_right(entropy, full) if entropy is not None else None)

    def log_probs_and_sum_pi_squared(self, batch: RLBatch, temperature: float) -> torch.Tensor:
        """(B, R, 2): log pi(response token) and the sum over the vocabulary of pi^2, from the full logits."""
        logits, responses = self._full_logits(batch, temperature)
        pair = torch.stack([logprobs_from_logits(logits, responses), sum_pi_squared_from_logits(logits)], dim=-1)
        return _pad_rows(pair, batch["responses"].shape[1])                                  # (B, R, 2)

    def log_probs_and_top_k(self, batch: RLBatch, temperature: float, k: int) -> torch.Tensor:
        """(B, R, 1 + 2k) from the full logits at `temperature`: log pi(response token), then the log-probs
        (full-vocabulary softmax) of pi's k most likely tokens at each response position, most likely first,
        then their ids (as float32, exact for a vocabulary below 2^24 tokens). GKD's teacher pass."""
        logits, responses = self._full_logits(batch, temperature)
        if k > logits.shape[-1]:
            raise ConfigError(f"algorithm.distill.top_k = {k} is more than the teacher's vocabulary "
                              f"({logits.shape[-1]} tokens); set top_k <= {logits.shape[-1]}")
        top, ids = logits.topk(k, dim=-1)                                                     # (B, R', k) each
        picked = torch.cat([logits.gather(-1, responses[..., None]), top], dim=-1) - logits.logsumexp(-1, keepdim=True)
        return _pad_rows(torch.cat([picked, ids.float()], dim=-1), batch["responses"].shape[1])

    def log_probs_at(self, batch: RLBatch, temperature: float, with_entropy: bool, ids: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """`log_probs`' (B, R) log-probs and entropy (or None), and (B, R, K) the log-probs at `temperature`
        (full-vocabulary softmax) of the tokens `ids` (B, R, K) names at each response position, all with grad,
        0 on padding, from the full logits whatever actor.logits_chunk_size says (GKD's student side)."""
        logits, responses = self._full_logits(batch, temperature)
        width, full = responses.shape[1], batch["responses"].shape[1]
        wanted = torch.cat([responses[..., None], ids[:, :width].to(self.device)], dim=-1)   # (B, R', 1 + K)
        picked = logits.gather(-1, wanted) - logits.logsumexp(-1, keepdim=True)
        padding = ~batch["response_mask"][:, :width].to(self.device).bool()  # packed rows: another token's scores
        picked = _pad_rows(picked.masked_fill(padding[..., None], 0), full)
        entropy = _pad_right(entropy_from_logits(logits).masked_fill(padding, 0), full) if with_entropy else None
        return picked[..., 0], entropy, picked[..., 1:]

    def values(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) a value model's output at the state before each response token, 0 on padding."""
        with self.autocast():
            inputs, width, packed = self.lay_out(batch)
            with attending(packed, self.module):
                out = self.module(**inputs).logits[..., 0].float()
            values = out[:, -width - 1:-1] if packed is None else packed.pick(out).masked_fill(~packed.valid, 0)
        return _pad_right(values, batch["responses"].shape[1])

    def _through_head(self, inputs: dict, responses: torch.Tensor, valid: torch.Tensor, temperature: float,
                      with_entropy: bool, packed: PackedRows | None):
        """The chunked head's (log-probs, entropy), each (B, R'); None when this model's head cannot be split
        off (then the full logits serve this pass and every later one)."""
        pick = functools.partial(packed.pick_valid, kept=self.keeps_logits) if packed else None
        scores = self.head(self.module, inputs, responses, valid, temperature, with_entropy, pick=pick)
        if scores is None:
            self._turn_off("logits_chunk_size", "its logits are not its LM head's plain product (or the head "
                           "cannot be hooked)")
        return scores

    def _full_logits(self, batch: RLBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R', V) float32 logits at `temperature` (`_logits`, any layout) and the (B, R') response tokens."""
        with self.autocast():
            inputs, width, packed = self.lay_out(batch)
            with attending(packed, self.module):
                logits = self._logits(inputs, width, packed, temperature)
        return logits, batch["responses"][:, :width].to(self.device)

    def _logits(self, inputs: dict, width: int, packed: PackedRows | None, temperature: float) -> torch.Tensor:
        """(B, R', V) float32 logits predicting each response token, at `temperature`."""
        out = self.module(**inputs).logits
        logits = (packed.pick(out, "logits_to_keep" in inputs) if packed else out[:, -width - 1:-1]).float()
        return logits / temperature if temperature != 1.0 else logits

    # ---- the layout of one micro-batch -----------------------------------------------------------------
    def lay_out(self, batch: RLBatch) -> tuple[dict, int, PackedRows | None]:
        """The module's keyword arguments for `batch` on the device, R', and the packed rows they hold (None:
        padded). Run the module on them inside `attending(packed, module)`."""
        packed = self.packed_rows(batch)
        if packed is not None:
            return packed.inputs(self.keeps_logits), packed.width, packed
        return *self.module_inputs(batch, keep_logits=self.keeps_logits), None

    def module_inputs(self, batch: RLBatch, keep_logits: bool = False) -> tuple[dict[str, Any], int]:
        """The padded layout: the module's keyword arguments for `batch`, on the device, and R'. The module's
        output ends with the R' + 1 positions whose outputs predict (or value) the response tokens;
        keep_logits asks a transformers model for those positions' logits only.

        With a KV cache (`cache_keyword`), each distinct prompt but its last token runs once, here, and
        the returned arguments continue every row from its prompt's cache. The cache reaches the rows
        by indexing, so autograd sums each prompt's gradient over its rows as the plain pass does:
        the same log-probs, values and gradients to float rounding, for the prompt's work once instead
        of n times."""
        plain, keep, split, width = self._plain_inputs(batch, keep_logits)
        if not self._shares_prompts(split) or not self._prompt_cache_works(batch):
            return plain, width
        return self._continue_from_prompts(plain["input_ids"], plain["attention_mask"], plain["position_ids"],
                                           split, keep), width

    def packed_rows(self, batch: RLBatch) -> PackedRows | None:
        """`batch` packed on the device, or None: it runs padded (`module_inputs`), as when packing is off, or
        through the shared prompt cache where that runs fewer tokens (on all ranks summed: every rank takes
        the same path, as many forwards). ROWS with share_prompts lays each distinct prompt once in the line,
        which runs fewer tokens than either. Before the first packed pass, `packing_agrees`."""
        if self.packing is None:
            return None
        share = self.packing == ROWS and self.section.share_prompts
        if not share:                                  # LINES, ONE_LINE: packed or the shared cache, the cheaper
            ids, _, _, width = model_inputs(batch)
            if self._shares_prompts(ids.shape[1] - width - 1):
                packed, shared = self.parallel.sum(torch.tensor([packed_cost(batch, self.packing), shared_cost(batch)],
                                                                dtype=torch.float64)).tolist()
                if shared < packed and self._prompt_cache_works(batch):
                    return None
        if "pack" not in self.checked and not self._packing_works(batch, share):
            return None
        return pack_rows(batch, self.packing, share_prompts=share).to(self.device)

    def _packing_works(self, batch: RLBatch, share: bool) -> bool:
        """Once, at the first packed pass: packed rows cannot see each other in this model (`packing_agrees`,
        every rank alike); `{key}.pack = true` with a model that fails it is a ConfigError."""
        self.checked.add("pack")
        with self.weights.inference(self.module):          # as a log-prob pass: no adapter dropout
            agrees = packing_agrees(self.module, batch, self.device, self.packing, share)
        if not self.parallel.max(int(not agrees)):
            return True
        key = f"{self.key}.pack"
        if self.section.pack is True:
            raise ConfigError(f"{key} = true, but {type(self.module).__name__} lets packed rows attend to "
                              f"each other (its attention ignores position_ids); set {key} = \"auto\" or false")
        self._turn_off("pack", "packed rows attend to each other (its attention ignores position_ids)")
        return False

    def _plain_inputs(self, batch: RLBatch, keep_logits: bool) -> tuple[dict[str, Any], dict, int, int]:
        """Every row's whole prompt and response as the module's keyword arguments, on the device; the
        logits_to_keep among them; the prompt columns that would go into a shared cache; R'."""
        ids, mask, pos, width = (x if isinstance(x, int) else x.to(self.device) for x in model_inputs(batch))
        keep = {"logits_to_keep": width + 1} if keep_logits else {}
        plain = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, **keep}
        return plain, keep, ids.shape[1] - width - 1, width

    def _shares_prompts(self, split: int) -> bool:
        """Whether a pass whose prompts put `split` columns into the cache runs through the shared prompt cache."""
        training = torch.is_grad_enabled() and self.module.training
        plain_backward = training and (not self.parallel.cached_backward or checkpointed(self.module))
        # under FSDP every rank must run as many forwards: one rank's one-token prompts make all run plain
        return not (self.cache_keyword is None or plain_backward or self.parallel.max(int(split < 1)))

    def _prompt_cache_works(self, batch: RLBatch) -> bool:
        """Whether the shared prompt cache serves this module: `_prompt_cache_agrees`, once, on the first
        batch that would go through it, before that batch's pass is laid out."""
        if "share_prompts" not in self.checked:
            self.checked.add("share_prompts")
            if not self._prompt_cache_agrees(*self._plain_inputs(batch, self.keeps_logits)):
                self._turn_off("share_prompts", "outputs through a shared prompt cache differ from a plain forward")
        return self.cache_keyword is not None

    def _continue_from_prompts(self, ids, mask, pos, split: int, keep: dict) -> dict[str, Any] | None:
        """The arguments that continue every row from the cache of its first `split` columns (each distinct
        one run once). None when the module returned no cache."""
        cache = prompt_cache(self.module, self.cache_keyword, ids[:, :split], mask[:, :split], bool(keep))
        return None if cache is None else {"input_ids": ids[:, split:], "attention_mask": mask,
                                           "position_ids": pos[:, split:], self.cache_keyword: cache,
                                           "use_cache": True, **keep}

    @torch.no_grad()
    def _prompt_cache_agrees(self, plain: dict[str, Any], keep: dict, split: int, width: int) -> bool:
        """On two rows, the outputs through the cache equal the plain pass's (a model that drops or misreads
        the cache would otherwise be wrong silently). It depends only on the model, so it runs in the weights'
        own dtype, autocast off (bf16's rounding differs between the two shapes by more than a tolerance
        that would still catch a misread cache), and every FSDP rank takes the same decision (each forward
        is a collective)."""
        few = {key: value[:2] if torch.is_tensor(value) else value for key, value in plain.items()}
        with torch.autocast(self.device.type, enabled=False):
            cached = self._continue_from_prompts(few["input_ids"], few["attention_mask"], few["position_ids"],
                                                 split, keep)
            expected = self.module(**few).logits[:, -width - 1:]
            got = self.module(**cached).logits[:, -width - 1:] if cached is not None else None
        tol = 1e-3 if expected.dtype in (torch.float32, torch.float64) else 5e-2     # bf16 / fp16 rounding
        agrees = got is not None and got.shape == expected.shape and \
            torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol)
        return self.parallel.max(int(not agrees)) == 0


def planned(config: Config, key: str) -> str:
    """What `config` asks of the `key` worker's forward passes ("actor", "critic"), before any model is
    known: what `--dry-run` prints. The built worker decides from its model (`ForwardPass.describe`)."""
    section = getattr(config, key)
    pack = {True: "packed (the model's attention must allow it)", False: LAYOUTS[None],
            "auto": "packed where the model's attention allows it, else padded rows"}[section.pack]
    prompts = "each distinct prompt once" if section.share_prompts else "every row whole"
    head = ([f"the LM head {config.actor.logits_chunk_size} positions at a time (a plain linear head)"]
            if config.actor.logits_chunk_size else ["the full logits"]) if key == "actor" else []
    dtype = "what model.compute_dtype = auto picks" if config.model.compute_dtype == "auto" else \
        autocast_dtype(config.model)
    return "; ".join([pack, prompts, *head, f"autocast to {dtype}" if dtype else config.model.dtype])


def _pad_right(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def _pad_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, R', ...) zero-padded on the right of dim 1 to (B, width, ...)."""
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, width - x.shape[1]))
