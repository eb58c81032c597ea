"""The PPO mechanics every backend shares: `TorchActor` and `TorchCritic` over Hugging Face-style modules.

Per step: the log-prob (or value) passes, then `ppo_epochs` passes over the batch in mini-batches, one
optimizer step each (AdamW, clipped, on the learning-rate schedule), each mini-batch split into
micro-batches (by rows or by a token budget) whose losses, scaled by the mini-batch's normalisers,
accumulate one gradient. How a micro-batch reaches the model (packed or padded rows, prompts shared, the
LM head in chunks, autocast) is the worker's `forward_pass` (workers/forward.py); nothing here depends on it.

What differs between backends is not subclassed but given to a worker as two strategies
(workers/strategies.py): `parallel`, how rows, sums and checkpoints are split over data-parallel ranks
(default `SingleProcess`), and `weights`, what trains and what a checkpoint and a rollout get of it
(default `FullWeights`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..algos import PolicyLossInputs, compute_actor_loss, compute_value_loss, loss_totals
from ..algos.distill import add_gkd_loss, gkd_settings
from ..batch import RLBatch
from ..config import ActorConfig, Config, CriticConfig, OptimConfig
from ..errors import ConfigError, NonFiniteError, removed
from ..protocols import Actor, Critic, PolicyLoss, Workers  # noqa: F401 (Workers: re-exported)
from .forward import ForwardPass
from .rows import token_budget_groups
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


def mean_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the optimizer steps of an update."""
    return {key: sum(step[key] for step in steps) / len(steps) for key in steps[0]} if steps else {}


class _TorchWorker:
    """Shared parts of actor and critic: device, optimizer, micro-batches, one optimizer step, checkpoints."""

    metric_prefix = "actor"
    """The worker's metric names start with it (actor/grad_norm), and so do the config keys messages name."""

    def __init__(self, module: torch.nn.Module, config: Config, section: ActorConfig | CriticConfig, *,
                 trainable: bool, mini_batch_prompts: int, device: torch.device | str,
                 parallel: DataParallel | None, weights: Weights | None):
        """section: this worker's own config (config.actor, also for the reference, or config.critic):
        its micro-batch limits, its forward pass's choices and, if trainable, its optimizer settings."""
        self.module, self.config, self.section = module, config, section
        self.mini_batch_prompts = mini_batch_prompts
        self.device = torch.device(device)
        self.parallel = parallel or SingleProcess()
        self.weights = weights or FullWeights()
        self.forward_pass = ForwardPass(module, config, section, key=self.metric_prefix,
                                        policy=isinstance(self, TorchActor), trainable=trainable, device=self.device,
                                        parallel=self.parallel, weights=self.weights)
        """How a micro-batch reaches the module: layout, shared prompts, head, precision (workers/forward.py)."""
        self.optimizer = self.scheduler = None
        if trainable:
            self.optimizer = torch.optim.AdamW(self.weights.parameters(module), lr=section.lr,
                                               betas=tuple(section.betas), weight_decay=section.weight_decay)
            updates_per_step = section.ppo_epochs * (config.data.batch_size // mini_batch_prompts)
            self.scheduler = build_scheduler(self.optimizer, section,
                                             lambda: (config.trainer.total_steps or 0) * updates_per_step)
        else:
            module.requires_grad_(False)

    def micro_batches(self, batch: RLBatch) -> list[list[int]]:
        """Row indices of each micro-batch: consecutive runs of micro_batch_size rows, or, with a token
        budget, rows grouped by length (`token_budget_groups`), as many groups on every rank."""
        rows, budget = self.section.micro_batch_size, self.section.max_tokens_per_micro_batch
        if not budget:
            size = rows or len(batch)
            return [list(range(i, min(i + size, len(batch)))) for i in range(0, len(batch), size)]
        groups = token_budget_groups(batch["prompt_mask"].sum(-1).tolist(), batch["response_mask"].sum(-1).tolist(),
                                     budget, f"{self.metric_prefix}.max_tokens_per_micro_batch",
                                     packed=self.forward_pass.packing is not None)
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
        for mini in batch.split_inputs(self.mini_batch_prompts * self.config.rollout.n or len(batch)):
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
        with self.weights.inference(self.module), self.forward_pass.casts_once():
            return self.parallel.on_my_rows(batch, on_rows)

    def epochs(self, batch: RLBatch, loss_of: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]], *,
               one_step: bool = False) -> dict[str, float]:
        """`section.ppo_epochs` passes over the batch's mini-batches, an optimizer step each; the steps'
        mean metrics. one_step: an on-policy update, which must be exactly one optimizer step."""
        mini_batches = list(self.minibatches(batch))
        if one_step and (self.section.ppo_epochs > 1 or len(mini_batches) > 1):
            raise ValueError("on_policy=True needs exactly one optimizer step (ppo_epochs = 1, one mini-batch)")
        self.module.train()
        steps = [self.optimizer_step(micro, norms, loss_of)
                 for _ in range(self.section.ppo_epochs) for micro, norms in mini_batches]
        return mean_metrics(steps)

    def optimizer_step(self, micro_batches: list[RLBatch], norms: dict[str, float],
                       loss_of: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> dict[str, float]:
        """Forward / backward every micro-batch (gradients accumulate), then one clipped optimizer step.

        loss_of(micro_batch, norms) -> (loss, metrics), both scaled by the mini-batch's normalisers:
        the metrics are each micro-batch's share, so their sum over micro-batches and ranks is the
        mini-batch's value, however the mini-batch was split. Returns those sums plus grad_norm and lr.
        """
        shares: dict[str, float] = defaultdict(float)
        finite = True
        with self.forward_pass.casts_once():
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

    def forward(self, batch: RLBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of the response tokens at the rollout temperature, and optionally entropy."""
        return self.forward_pass.log_probs(batch, self.temperature, with_entropy)

    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) log pi(response token), zero on padding."""
        return self.per_row(batch, lambda mb: self.forward(mb)[0])

    def compute_log_probs_and_sum_pi_squared(self, batch: RLBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) log pi(response token) and (B, R) sum over the vocabulary of pi^2 at each response
        position, zero on padding, from one pass over the full logits (the optimal token baseline's inputs)."""
        out = self.per_row(batch, lambda mb: self.forward_pass.log_probs_and_sum_pi_squared(mb, self.temperature),
                           extra=(2,))
        return out[..., 0], out[..., 1]

    def compute_log_probs_and_top_k(self, batch: RLBatch, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, R) log pi(response token), (B, R, k) int64 ids of pi's k most likely tokens at each response position
        and (B, R, k) their log-probs, zero on padding, from one pass over the full logits (GKD's teacher pass)."""
        out = self.per_row(batch, lambda mb: self.forward_pass.log_probs_and_top_k(mb, self.temperature, k),
                           extra=(1 + 2 * k,))
        return out[..., 0], out[..., 1 + k:].long(), out[..., 1:1 + k]

    @property
    def lora(self) -> bool:
        """Whether an adapter trains (the Actor protocol's optional `lora`: full_tensors is the merged model)."""
        return self.weights.lora

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) per entry of the model a rollout loads, one at a time (`weights.full_tensors`);
        a sharded (DTensor) entry is gathered, so under torchrun this is a collective every rank must consume whole."""
        return self.weights.full_tensors(self.module)

    def update(self, batch: RLBatch, policy_loss: PolicyLoss, *, on_policy: bool = False,
               **removed_keywords: Any) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) split into micro-batches.

        policy_loss: the registered loss (`actor.policy_loss`), see nanoverl_core.algos.PolicyLossInputs.
        on_policy: this is the step's only update and the batch was sampled by this very policy, so
            pi_old is this forward's policy: old log-probs are taken from it (detached) instead of
            batch["old_log_probs"], and the loss is told so (the trainer decides: trainer/plan.py).
        `on_policy_update` returns the update's log-probs too (0.2.0's `keep_log_probs`, removed in 0.4.0:
        passing it is one line naming it).
        """
        if "keep_log_probs" in removed_keywords:
            raise removed("Actor.update(..., keep_log_probs=...)", "call on_policy_update(batch, policy_loss), "
                          "which returns (metrics, log_probs): the log-probs update_log_probs held")
        if removed_keywords:
            raise TypeError(f"update() got unexpected keyword arguments {sorted(removed_keywords)}")
        return self.epochs(batch, self._loss(policy_loss, on_policy), one_step=on_policy)

    def on_policy_update(self, batch: RLBatch, policy_loss: PolicyLoss) -> tuple[dict[str, float], torch.Tensor]:
        """`update(batch, policy_loss, on_policy=True)`, returning with its metrics the (B, R) log-probs its
        forward computed: detached, on the CPU, every rank's rows in row order, zero on padding. That is
        pi_old, what `compute_log_probs` would have returned just before, without a pass of its own."""
        kept: list[torch.Tensor] = []
        metrics = self.epochs(batch, self._loss(policy_loss, on_policy=True, kept=kept), one_step=True)
        return metrics, self._rows_of(batch, kept)

    def _loss(self, policy_loss: PolicyLoss, on_policy: bool, kept: list[torch.Tensor] | None = None):
        """loss_of(micro_batch, norms) for `optimizer_step`: the micro-batch's PPO loss and metrics (kept: the
        detached log-probs of each micro-batch are appended to it). With [algorithm.distill] gkd_coef > 0 and the
        teacher's top-k columns, the forward also gives the student's log-probs of those tokens, for the GKD term."""
        cfg, gkd = self.section, gkd_settings(self.config)
        scale = cfg.loss_scale_factor or self.config.rollout.max_new_tokens

        def loss_of(mb: RLBatch, norms: dict[str, float]):
            ids = mb["teacher_topk_ids"] if gkd is not None and "teacher_topk_ids" in mb else None
            log_prob, entropy, student_top_k = (*self.forward(mb, with_entropy=cfg.entropy_coeff != 0), None) \
                if ids is None else self.forward_pass.log_probs_at(mb, self.temperature, cfg.entropy_coeff != 0, ids)
            old = log_prob.detach() if on_policy else mb["old_log_probs"].to(self.device)
            if kept is not None:
                kept.append(old.float().cpu())
            weights = mb["rollout_is_weights"].to(self.device) if "rollout_is_weights" in mb else None
            inputs = PolicyLossInputs(log_prob, old, mb["advantages"].to(self.device), mb["loss_mask"].to(self.device),
                                      loss_agg_mode=cfg.loss_agg_mode, loss_scale_factor=scale,
                                      on_policy=on_policy, rollout_is_weights=weights, **norms)
            ref = mb["ref_log_probs"].to(self.device) if cfg.use_kl_loss else None
            loss, metrics = compute_actor_loss(policy_loss, inputs, cfg, entropy=entropy, ref_log_prob=ref)
            return (loss, metrics) if ids is None else \
                add_gkd_loss(loss, metrics, student_top_k, mb["teacher_topk_log_probs"].to(self.device), inputs, gkd)
        return loss_of

    def _rows_of(self, batch: RLBatch, per_micro_batch: list[torch.Tensor]) -> torch.Tensor:
        """The per-micro-batch outputs of a one-mini-batch update put back in row order, every rank's rows
        gathered, zero on padding: (B, R), as `per_row` would have computed them (the split is `minibatches`'
        own, deterministic: the whole batch's share is its one mini-batch's)."""
        def on_rows(rows: RLBatch) -> torch.Tensor:
            out = torch.zeros(rows["response_mask"].shape, dtype=torch.float32)
            for group, values in zip(self.micro_batches(rows), per_micro_batch, strict=True):
                out[group] = values
            return out * rows["response_mask"]
        return self.parallel.on_my_rows(batch, on_rows)


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
        """(B, R) values of the states before each response token."""
        return self.forward_pass.values(batch)

    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) value estimates, zero on padding."""
        return self.per_row(batch, self.forward)

    def update(self, batch: RLBatch) -> dict[str, float]:
        """Value-loss epochs over mini-batches (one optimizer step each) split into micro-batches."""
        cfg = self.section

        def loss_of(mb: RLBatch, norms: dict[str, float]):
            return compute_value_loss(self.forward(mb), mb["returns"].to(self.device), mb["values"].to(self.device),
                                      mb["loss_mask"].to(self.device), cliprange_value=cfg.cliprange_value,
                                      loss_agg_mode=cfg.loss_agg_mode, **norms)
        return self.epochs(batch, loss_of)
