"""The PPO mechanics every backend shares: `TorchActor` and `TorchCritic` over Hugging Face-style modules.

Micro-batches (by rows or by a token budget), gradient accumulation with the mini-batch's
normalisers, clipping, the learning-rate schedule and the policy / value passes. What differs between
backends is not subclassed but given to a worker as two strategies (workers/strategies.py):
`parallel`, how rows, sums and checkpoints are split over data-parallel ranks (default
`SingleProcess`), and `weights`, what trains and what a checkpoint and a rollout get of it (default
`FullWeights`).

Module conventions: ``module(input_ids=, attention_mask=, position_ids=)`` returns an object with
``.logits``: ``(B, T, V)`` for a policy, ``(B, T, 1)`` for a value model. A policy whose
``get_output_embeddings()`` is an ``nn.Linear`` gets its response log-probs through that head a chunk
of positions at a time (``actor.logits_chunk_size``, workers/lm_head.py). A micro-batch's rows run end to
end without padding (``actor.pack``, workers/packing.py), an sdpa model's with each distinct prompt laid
once (``actor.share_prompts``); other models run each distinct prompt once through a KV cache
(workers/prompt_cache.py) where that runs fewer tokens or packing cannot run. With `model.compute_dtype`
set, every module pass runs under its autocast
(`autocast`), each weight cast once per optimizer step or log-prob pass (`casts_once`); weights, gradients
and AdamW state stay in `model.dtype`. With `model.compile`, the parts
of each block that hold no KV cache run through torch.compile (workers/compile.py).

The shared worker base and its two subclasses are one mechanism, read together; the parts that stand
alone are their own modules: the strategies, a batch's rows as module inputs (rows.py), prompt
caching, the LM head and checkpoint files.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..algos import (PolicyLossInputs, compute_actor_loss, compute_value_loss, entropy_from_logits,
                     logprobs_from_logits, loss_totals, sum_pi_squared_from_logits)
from ..batch import RLBatch
from ..config import ActorConfig, Config, CriticConfig, ModelConfig, OptimConfig
from ..errors import ConfigError, NonFiniteError
from ..protocols import Actor, Critic, PolicyLoss, Workers  # noqa: F401 (Workers: re-exported)
from .compile import compile_blocks
from .lm_head import ChunkedHead
from .packing import ROWS, PackedRows, attending, pack_rows, packed_cost, packing_agrees, packing_for, shared_cost
from .precision import Float32Attention, cpu_has_fast
from .prompt_cache import cache_keyword, checkpointed, forward_keyword, prompt_cache
from .rows import model_inputs, token_budget_groups
from .strategies import DataParallel, FullWeights, SingleProcess, Weights


def resolve_device(name: str) -> torch.device:
    """`trainer.device` as a torch device: "auto" picks cuda when available; a missing device is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"trainer.device = {name!r} is not a device; use auto, cpu or cuda[:N]") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ConfigError(f"trainer.device = {name!r} but no such CUDA device is available; "
                          "use trainer.device=cpu or auto")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"trainer.device = {name!r} is not supported; use auto, cpu or cuda[:N]")
    return device


def autocast_dtype(model: ModelConfig) -> str:
    """The dtype `model.compute_dtype` casts to: "" when it is unset or model.dtype itself (the weights'
    own dtype: no cast to make)."""
    return model.compute_dtype if model.compute_dtype != model.dtype else ""


def autocast(model: ModelConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """`model.compute_dtype` as a context for a forward pass on `device`: torch.autocast to
    `autocast_dtype`, or nothing when there is no cast to make. On CPU a pass entered with gradients
    enabled runs its attention in float32 (`precision.Float32Attention`: bf16's backward is slow there),
    unless gradient checkpointing recomputes the blocks in backward, where only autocast is restored."""
    dtype = autocast_dtype(model)
    if not dtype:
        return contextlib.nullcontext()
    return _autocast(device, getattr(torch, dtype), float32_attention=not model.gradient_checkpointing)


@contextlib.contextmanager
def _autocast(device: torch.device, dtype: torch.dtype, float32_attention: bool):
    float32_attention = float32_attention and device.type == "cpu" and torch.is_grad_enabled()
    with torch.autocast(device.type, dtype=dtype), (Float32Attention() if float32_attention else
                                                    contextlib.nullcontext()):
        yield


@functools.cache
def _warn_slow_compute_dtype(dtype: str) -> None:
    """Once per process: model.compute_dtype on a CPU that emulates it."""
    if not cpu_has_fast(dtype):
        print(f"warning: model.compute_dtype = {dtype!r}, but this CPU has no {dtype} matmul instructions: its "
              "matmuls run many times slower than float32 here; leave model.compute_dtype empty (or \"auto\") on "
              "this machine",
              file=sys.stderr)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_updates: int | Callable[[], int]):
    """Linear warm-up, then constant / cosine / linear decay to min_lr_ratio at the last update.
    `total_updates` may be a function, read at each step: with trainer.total_epochs the step count is
    known only once the data is loaded, after the workers are built."""
    def factor(step: int) -> float:
        total = total_updates() if callable(total_updates) else total_updates
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        if total is None:  # trainer.total_epochs before the data is loaded: only LambdaLR's own call at step 0
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _pad_right(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


class _TorchWorker:
    """Shared parts of actor and critic: device, optimizer, micro-batches, one optimizer step, checkpoints."""

    metric_prefix = "actor"
    """The worker's metric names start with it (actor/grad_norm), and so do the config keys messages name."""
    keeps_logits = False
    """Whether the module's forward takes logits_to_keep and the worker asks for the last positions only
    (the actor's log-probs; a value head's outputs are all kept)."""

    def __init__(self, module: torch.nn.Module, config: Config, section: ActorConfig | CriticConfig, *,
                 trainable: bool, mini_batch_prompts: int, device: torch.device | str,
                 parallel: DataParallel | None, weights: Weights | None):
        """section: this worker's own config (config.actor, also for the reference, or config.critic):
        its micro-batch limits, share_prompts and, if trainable, its optimizer settings."""
        self.module = module
        self.config = config
        self.section = section
        self.mini_batch_prompts = mini_batch_prompts
        self.device = torch.device(device)
        self.parallel = parallel or SingleProcess()
        self.weights = weights or FullWeights()
        self.cache_keyword = cache_keyword(module) if section.share_prompts else None
        """Set: each distinct prompt of a micro-batch runs once (`module_inputs`); None: every row runs whole."""
        self.prompts_checked = False
        self.packing = packing_for(module, section.pack, f"{self.metric_prefix}.pack")
        """The layout a micro-batch is packed in (workers/packing.py), or None: every pass runs padded."""
        self.packing_checked = False
        self.keeps_casts = trainable and bool(autocast_dtype(config.model)) and \
            not config.model.gradient_checkpointing and not any(hasattr(p, "full_tensor") for p in module.parameters())
        """Whether `casts_once` keeps autocast's weight casts over a pass's micro-batches (see there; autocast
        keeps none of a frozen worker's weights)."""
        if self.device.type == "cpu" and autocast_dtype(config.model):
            _warn_slow_compute_dtype(autocast_dtype(config.model))
        if config.model.compile:
            compile_blocks(module, self.device)
        self.optimizer = self.scheduler = None
        if trainable:
            self.optimizer = torch.optim.AdamW(self.weights.parameters(module), lr=section.lr,
                                               betas=tuple(section.betas), weight_decay=section.weight_decay)
            updates_per_step = section.ppo_epochs * (config.data.batch_size // mini_batch_prompts)
            self.scheduler = build_scheduler(self.optimizer, section,
                                             lambda: (config.trainer.total_steps or 0) * updates_per_step)
        else:
            module.requires_grad_(False)

    def autocast(self) -> contextlib.AbstractContextManager:
        """A fresh context for one forward pass: `model.compute_dtype`'s autocast on this worker's device, or
        nothing. Backward runs outside it, as torch.autocast asks: each op's gradient in its forward's dtype."""
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

    def clip_and_step(self, nonfinite_loss: bool) -> float:
        """Clip the global grad norm, then step unless anything is non-finite. Returns the norm."""
        # every rank must take the same decision, or the next collective waits forever
        nonfinite_loss = self.parallel.anywhere(nonfinite_loss)
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = self.section.grad_clip or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if nonfinite_loss or not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"non-finite {'loss' if nonfinite_loss else 'gradient norm'} ({norm}); "
                                 "the optimizer did not step")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def module_inputs(self, batch: RLBatch, keep_logits: bool = False) -> tuple[dict[str, Any], int]:
        """The module's keyword arguments for `batch`, on the device, and R' (the trimmed response width).
        The module's output ends with the R' + 1 positions whose outputs predict (or value) the response
        tokens; keep_logits asks a transformers model for those positions' logits only.

        With a KV cache (`cache_keyword`), each distinct prompt but its last token runs once, here, and
        the returned arguments continue every row from its prompt's cache. The cache reaches the rows
        by indexing, so autograd sums each prompt's gradient over its rows as the plain pass does:
        the same log-probs, values and gradients to float rounding, for the prompt's work once instead
        of n times. Gradient checkpointing drops caches, so a checkpointed training pass runs plain (as
        does every training pass where the data-parallel strategy allows no cached backward, FSDP's).
        """
        plain, keep, split, width = self._plain_inputs(batch, keep_logits)
        if not self._shares_prompts(split) or not self._prompt_cache_works(batch):
            return plain, width
        return self._continue_from_prompts(plain["input_ids"], plain["attention_mask"], plain["position_ids"],
                                           split, keep), width

    def _plain_inputs(self, batch: RLBatch, keep_logits: bool) -> tuple[dict[str, Any], dict, int, int]:
        """Every row's whole prompt and response as the module's keyword arguments, on the device; the
        logits_to_keep among them; the prompt columns that would go into a shared cache; R'."""
        ids, mask, pos, width = (x if isinstance(x, int) else x.to(self.device) for x in model_inputs(batch))
        keep = {"logits_to_keep": width + 1} if keep_logits else {}
        plain = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, **keep}
        return plain, keep, ids.shape[1] - width - 1, width

    def _prompt_cache_works(self, batch: RLBatch) -> bool:
        """Whether the shared prompt cache serves this module: `_prompt_cache_agrees`, once, on the first
        batch that would go through it, before that batch's pass is laid out. The pass then takes the
        path every later pass takes (a resumed run meets the check at another step than the unbroken run
        and must compute what it computed)."""
        if not self.prompts_checked:
            self.prompts_checked = True
            if not self._prompt_cache_agrees(*self._plain_inputs(batch, self.keeps_logits)):
                self.cache_keyword = None
        return self.cache_keyword is not None

    def _shares_prompts(self, split: int) -> bool:
        """Whether a pass whose prompts put `split` columns into the cache runs through the shared prompt cache."""
        training = torch.is_grad_enabled() and self.module.training
        plain_backward = training and (not self.parallel.cached_backward or checkpointed(self.module))
        # under FSDP every rank must run as many forwards: one rank's one-token prompts make all run plain
        return not (self.cache_keyword is None or plain_backward or self.parallel.max(int(split < 1)))

    def packed_rows(self, batch: RLBatch) -> PackedRows | None:
        """`batch` packed on the device (workers/packing.py), or None: it runs padded (`module_inputs`), as when
        packing is off, or through the shared prompt cache, where that runs fewer tokens (on all ranks summed:
        every rank takes the same path, as many forwards). ROWS with share_prompts lays each distinct prompt
        once in the line, which runs fewer tokens than either. Before the first packed pass, `packing_agrees`."""
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
        if not self.packing_checked:
            self.packing_checked = True
            with self.weights.inference(self.module):          # as a log-prob pass: no adapter dropout
                agrees = packing_agrees(self.module, batch, self.device, self.packing, share)
            if self.parallel.max(int(not agrees)):
                key = f"{self.metric_prefix}.pack"
                if self.section.pack is True:
                    raise ConfigError(f"{key} = true, but {type(self.module).__name__} lets packed rows attend to "
                                      f"each other (its attention ignores position_ids); set {key} = \"auto\" or false")
                print(f"warning: {type(self.module).__name__}: packed rows attend to each other (its attention "
                      f"ignores position_ids); {key} is off for this run", file=sys.stderr)
                self.packing = None
                return None
        return pack_rows(batch, self.packing, share_prompts=share).to(self.device)

    def _continue_from_prompts(self, ids, mask, pos, split: int, keep: dict) -> dict[str, Any] | None:
        """The arguments that continue every row from the cache of its first `split` columns (each distinct
        one run once). None when the module returned no cache."""
        cache = prompt_cache(self.module, self.cache_keyword, ids[:, :split], mask[:, :split], bool(keep))
        return None if cache is None else {"input_ids": ids[:, split:], "attention_mask": mask,
                                           "position_ids": pos[:, split:], self.cache_keyword: cache,
                                           "use_cache": True, **keep}

    @torch.no_grad()
    def _prompt_cache_agrees(self, plain: dict[str, Any], keep: dict, split: int, width: int) -> bool:
        """Before the first cached pass: on two rows, the outputs through the cache equal the plain
        pass's (a model that drops or misreads the cache would otherwise be wrong silently). It depends
        only on the model, so it runs in the weights' own dtype, autocast off (bf16's rounding differs
        between the two shapes by more than a tolerance that would still catch a misread cache), and every
        FSDP rank takes the same decision (each forward is a collective)."""
        few = {key: value[:2] if torch.is_tensor(value) else value for key, value in plain.items()}
        with torch.autocast(self.device.type, enabled=False):
            cached = self._continue_from_prompts(few["input_ids"], few["attention_mask"], few["position_ids"],
                                                 split, keep)
            expected = self.module(**few).logits[:, -width - 1:]
            got = self.module(**cached).logits[:, -width - 1:] if cached is not None else None
        tol = 1e-3 if expected.dtype in (torch.float32, torch.float64) else 5e-2     # bf16 / fp16 rounding
        agrees = got is not None and got.shape == expected.shape and \
            torch.allclose(got.float(), expected.float(), rtol=tol, atol=tol)
        if not agrees:
            print(f"warning: {type(self.module).__name__}: outputs through a shared prompt cache differ from a plain "
                  f"forward; {self.metric_prefix}.share_prompts is off for this run", file=sys.stderr)
        return self.parallel.max(int(not agrees)) == 0

    def micro_batches(self, batch: RLBatch) -> list[list[int]]:
        """Row indices of each micro-batch: consecutive runs of micro_batch_size rows, or, with a token
        budget, rows grouped by length (`token_budget_groups`), as many groups on every rank."""
        rows, budget = self.section.micro_batch_size, self.section.max_tokens_per_micro_batch
        if not budget:
            size = rows or len(batch)
            return [list(range(i, min(i + size, len(batch)))) for i in range(0, len(batch), size)]
        groups = token_budget_groups(batch["prompt_mask"].sum(-1).tolist(), batch["response_mask"].sum(-1).tolist(),
                                     budget, f"{self.metric_prefix}.max_tokens_per_micro_batch",
                                     packed=self.packing is not None)
        target = self.parallel.max(len(groups))
        while len(groups) < target:  # split the largest group: still within the budget, still non-empty
            largest = max(range(len(groups)), key=lambda g: len(groups[g]))
            group = groups.pop(largest)
            groups[largest:largest] = [group[:len(group) // 2], group[len(group) // 2:]]
        return groups

    def minibatches(self, batch: RLBatch):
        """Yield (micro-batches, normalisers) per mini-batch of the whole batch: this rank's share of it
        (`parallel.my_share`) split into micro-batches, and the normalisers of the whole mini-batch
        (every rank holds it), so that the micro-batch losses of all ranks sum to the mini-batch's loss.
        The split is deterministic, so runs are reproducible."""
        for mini in batch.split(self.mini_batch_prompts * self.config.rollout.n or len(batch)):
            norms = loss_totals(mini["loss_mask"])
            share = self.parallel.my_share(mini)
            yield [share.index(rows) for rows in self.micro_batches(share)], norms

    @torch.no_grad()
    def per_row(self, batch: RLBatch, compute: Callable[[RLBatch], torch.Tensor], extra: tuple[int, ...] = ()
                ) -> torch.Tensor:
        """compute(micro_batch) -> (b, R, *extra) over this rank's rows in micro-batches, then every rank's
        rows reassembled in row order on the CPU, zero on padding: (B, R, *extra). A log-prob or value pass."""
        def on_rows(rows: RLBatch) -> torch.Tensor:
            mask = rows["response_mask"]
            out = torch.zeros(mask.shape + extra, dtype=torch.float32)
            for group in self.micro_batches(rows):
                out[group] = compute(rows.index(group)).float().cpu()
            return out * mask.view(mask.shape + (1,) * len(extra))
        with self.weights.inference(self.module), self.casts_once():
            return self.parallel.on_my_rows(batch, on_rows)

    def optimizer_step(self, micro_batches: list[RLBatch], norms: dict[str, float],
                       loss_of: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> dict[str, float]:
        """Forward / backward every micro-batch (gradients accumulate), then one clipped optimizer step.

        loss_of(micro_batch, norms) -> (loss, metrics), both scaled by the mini-batch's normalisers:
        the metrics are each micro-batch's share, so their sum over micro-batches and ranks is the
        mini-batch's value, however the mini-batch was split. Returns those sums plus grad_norm and lr.
        """
        shares: dict[str, float] = defaultdict(float)
        finite = True
        with self.casts_once():
            for mb in micro_batches:
                loss, metrics = loss_of(mb, norms)
                finite &= bool(torch.isfinite(loss))
                (loss * self.parallel.size).backward()  # FSDP averages gradients over ranks; undo that
                for key, value in metrics.items():
                    shares[key] += float(value)
        keys = sorted(shares)
        totals = self.parallel.sum(torch.tensor([shares[k] for k in keys], dtype=torch.float64)).tolist()
        out = dict(zip(keys, totals))
        out[f"{self.metric_prefix}/grad_norm"] = self.clip_and_step(not finite)
        out[f"{self.metric_prefix}/lr"] = self.scheduler.get_last_lr()[0]
        return out

    # checkpoints: the format is the data-parallel strategy's, what it holds the weights strategy's
    def save(self, path: Path) -> None:
        self.parallel.save(path, self.module, self.optimizer, self.scheduler, self.weights)

    def load(self, path: Path) -> None:
        self.parallel.load(path, self.module, self.optimizer, self.scheduler, self.weights, self.device)


class TorchActor(_TorchWorker):
    """A policy (trainable) or reference (frozen) over a causal LM module.

    parallel, weights: the strategies it is composed of (workers/strategies.py); None is one process
    (`SingleProcess`) training every weight (`FullWeights`)."""

    def __init__(self, module: torch.nn.Module, config: Config, *, trainable: bool = True,
                 device: torch.device | str = "cpu", parallel: DataParallel | None = None,
                 weights: Weights | None = None):
        super().__init__(module, config, config.actor, trainable=trainable,
                         mini_batch_prompts=config.actor_mini_batch_size, device=device, parallel=parallel,
                         weights=weights)
        # what the weights add to the Actor protocol (a LoRA adapter: save_adapter, base_tensors, ...)
        for name, value in self.weights.actor_attributes(module).items():
            setattr(self, name, value)
        self.temperature = config.rollout.temperature
        # transformers models can run the LM head on the last positions only: the prompt's logits
        # (B, P, V) are never needed, and at a real vocabulary they are most of the head's cost
        self.keeps_logits = forward_keyword(module, "logits_to_keep") is not None
        # and the response positions' (B, R', V) logits need not exist at once either (actor.logits_chunk_size);
        # None: the module has no plain linear head (or chunking is off), the full logits are used
        self.chunked_head = ChunkedHead.of(module, config.actor.logits_chunk_size, compiled=config.model.compile)

    def forward(self, batch: RLBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of the response tokens at the rollout temperature, and optionally entropy.
        The module runs under `model.compute_dtype` (autocast); log-softmax and entropy take float32 logits."""
        with self.autocast(), contextlib.ExitStack() as stack:
            inputs, width, packed = self._inputs(batch)
            stack.enter_context(attending(packed, self.module))
            responses = batch["responses"][:, :width].to(self.device)             # (B, R')
            valid = batch["response_mask"][:, :width].to(self.device).bool()
            scores = None
            if self.chunked_head is not None:     # its float32 log-softmax runs inside the module's forward
                pick = functools.partial(packed.pick_valid, kept=self.keeps_logits) if packed else None
                scores = self.chunked_head(self.module, inputs, responses, valid, self.temperature, with_entropy,
                                           pick=pick)
                if scores is None:
                    self.chunked_head = None      # this model's head cannot be split off: full logits from now on
            logits = self._logits(inputs, width, packed) if scores is None else None
        if scores is None:
            scores = logprobs_from_logits(logits, responses), (entropy_from_logits(logits) if with_entropy else None)
            if packed is not None:                # padding positions of packed rows hold another token's scores
                scores = tuple(x.masked_fill(~valid, 0) if x is not None else None for x in scores)
        log_probs, entropy = scores
        full = batch["responses"].shape[1]
        return _pad_right(log_probs, full), (_pad_right(entropy, full) if entropy is not None else None)

    def _inputs(self, batch: RLBatch) -> tuple[dict, int, PackedRows | None]:
        """The module's keyword arguments for `batch`, R', and the packed rows they hold (None: padded)."""
        packed = self.packed_rows(batch)
        if packed is not None:
            return packed.inputs(self.keeps_logits), packed.width, packed
        return *self.module_inputs(batch, keep_logits=self.keeps_logits), None

    def _logits(self, inputs: dict, width: int, packed: PackedRows | None = None) -> torch.Tensor:
        """(B, R', V) float32 logits predicting each response token, at the rollout temperature."""
        out = self.module(**inputs).logits
        logits = (packed.pick(out, "logits_to_keep" in inputs) if packed else out[:, -width - 1:-1]).float()
        return logits / self.temperature if self.temperature != 1.0 else logits

    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) log pi(response token), zero on padding."""
        return self.per_row(batch, lambda mb: self.forward(mb)[0])

    def compute_log_probs_and_sum_pi_squared(self, batch: RLBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) log pi(response token) and (B, R) sum over the vocabulary of pi^2 at each response
        position, zero on padding, from one pass over the full logits (the optimal token baseline's inputs)."""
        def both(mb: RLBatch) -> torch.Tensor:
            with self.autocast():
                inputs, width, packed = self._inputs(mb)
                with attending(packed, self.module):
                    logits = self._logits(inputs, width, packed)
            pair = torch.stack([logprobs_from_logits(logits, mb["responses"][:, :width].to(self.device)),
                                sum_pi_squared_from_logits(logits)], dim=-1)                  # (b, R', 2)
            return torch.nn.functional.pad(pair, (0, 0, 0, mb["responses"].shape[1] - width))
        out = self.per_row(batch, both, extra=(2,))
        return out[..., 0], out[..., 1]

    @property
    def lora(self) -> bool:
        """Whether an adapter trains (the Actor protocol's optional `lora`: full_tensors is the merged model)."""
        return self.weights.lora

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) per entry of the model a rollout loads, one at a time (`weights.full_tensors`);
        a sharded (DTensor) entry is gathered, so under torchrun this is a collective every rank must consume whole."""
        return self.weights.full_tensors(self.module)

    update_log_probs: torch.Tensor | None = None

    def update(self, batch: RLBatch, policy_loss: PolicyLoss, *, on_policy: bool = False,
               keep_log_probs: bool = False) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) split into micro-batches.

        policy_loss: the registered loss (`actor.policy_loss`), see nanoverl_core.algos.PolicyLossInputs.
        on_policy: this is the step's only update and the batch was sampled by this very policy, so
            pi_old is this forward's policy: old log-probs are taken from it (detached) instead of
            batch["old_log_probs"], and the loss is told so (the trainer decides: `Trainer._build`).
        keep_log_probs (with on_policy): keep those detached log-probs of every row, every rank's
            gathered, in `self.update_log_probs` (B, R): what a separate old-log-prob pass would give,
            for the rollout-mismatch metrics, without that pass.
        """
        cfg = self.section
        scale = cfg.loss_scale_factor or self.config.rollout.max_new_tokens
        mini_batches = list(self.minibatches(batch))
        if on_policy and (cfg.ppo_epochs > 1 or len(mini_batches) > 1):
            raise ValueError("on_policy=True needs exactly one optimizer step (ppo_epochs = 1, one mini-batch)")
        if keep_log_probs and not on_policy:
            raise ValueError("keep_log_probs=True needs on_policy=True (the forward must be pi_old's)")
        self.module.train()
        kept: list[torch.Tensor] = []

        def loss_of(mb: RLBatch, norms: dict[str, float]):
            mask = mb["loss_mask"].to(self.device)
            log_prob, entropy = self.forward(mb, with_entropy=cfg.entropy_coeff != 0)
            old = log_prob.detach() if on_policy else mb["old_log_probs"].to(self.device)
            if keep_log_probs:
                kept.append(old.float().cpu())
            weights = mb["rollout_is_weights"].to(self.device) if "rollout_is_weights" in mb else None
            inputs = PolicyLossInputs(log_prob, old, mb["advantages"].to(self.device), mask,
                                      loss_agg_mode=cfg.loss_agg_mode, loss_scale_factor=scale,
                                      on_policy=on_policy, rollout_is_weights=weights, **norms)
            ref = mb["ref_log_probs"].to(self.device) if cfg.use_kl_loss else None
            return compute_actor_loss(policy_loss, inputs, cfg, entropy=entropy, ref_log_prob=ref)

        steps = []
        for _ in range(cfg.ppo_epochs):
            for micro_batches, norms in mini_batches:
                steps.append(self.optimizer_step(micro_batches, norms, loss_of))
        if keep_log_probs:
            self.update_log_probs = self._rows_of(batch, kept)
        return mean_metrics(steps)

    def _rows_of(self, batch: RLBatch, per_micro_batch: list[torch.Tensor]) -> torch.Tensor:
        """The update's per-micro-batch outputs of a one-mini-batch update put back in row order, every
        rank's rows gathered, zero on padding: (B, R), as `per_row` would have computed them. The split is
        `minibatches`' own (deterministic): on the rows of `my_share` (the same as `on_my_rows`' for the
        whole batch, which is the one mini-batch), so the micro-batches are found again."""
        def on_rows(rows: RLBatch) -> torch.Tensor:
            out = torch.zeros(rows["response_mask"].shape, dtype=torch.float32)
            for group, values in zip(self.micro_batches(rows), per_micro_batch, strict=True):
                out[group] = values
            return out * rows["response_mask"]
        return self.parallel.on_my_rows(batch, on_rows)


def mean_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the optimizer steps of an update."""
    return {key: sum(step[key] for step in steps) / len(steps) for key in steps[0]} if steps else {}


class TorchCritic(_TorchWorker):
    """A value model: module(...).logits is (B, T, 1); values are read at the state before each response token.
    parallel, weights: as for TorchActor."""

    metric_prefix = "critic"

    def __init__(self, module: torch.nn.Module, config: Config, device: torch.device | str = "cpu", *,
                 parallel: DataParallel | None = None, weights: Weights | None = None):
        super().__init__(module, config, config.critic, trainable=True,
                         mini_batch_prompts=config.critic_mini_batch_size, device=device, parallel=parallel,
                         weights=weights)

    def forward(self, batch: RLBatch) -> torch.Tensor:
        with self.autocast():
            packed = self.packed_rows(batch)
            if packed is not None:                # (k, W) -> each response token's state; 0 on padding
                with packed.attending(self.module):
                    values = packed.pick(self.module(**packed.inputs(keep_logits=False)).logits[..., 0].float())
                values = values.masked_fill(~packed.valid, 0)
            else:
                inputs, width = self.module_inputs(batch)
                values = self.module(**inputs).logits[..., 0].float()[:, -width - 1:-1]
        return _pad_right(values, batch["responses"].shape[1])

    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) value estimates, zero on padding."""
        return self.per_row(batch, self.forward)

    def update(self, batch: RLBatch) -> dict[str, float]:
        """Value-loss epochs over mini-batches (one optimizer step each) split into micro-batches."""
        cfg = self.section
        self.module.train()

        def loss_of(mb: RLBatch, norms: dict[str, float]):
            return compute_value_loss(self.forward(mb), mb["returns"].to(self.device), mb["values"].to(self.device),
                                      mb["loss_mask"].to(self.device), cliprange_value=cfg.cliprange_value,
                                      loss_agg_mode=cfg.loss_agg_mode, **norms)

        steps = []
        for _ in range(cfg.ppo_epochs):
            for micro_batches, norms in self.minibatches(batch):
                steps.append(self.optimizer_step(micro_batches, norms, loss_of))
        return mean_metrics(steps)
