"""Policy / reference / value workers.

A worker plugin registers ``make_workers(config) -> Workers``. Its job is to build torch modules
and a tokenizer; the PPO mechanics (micro-batches, gradient accumulation, clipping, schedule, loss
normalisation, checkpoints) live here once, in ``TorchActor`` and ``TorchCritic``, so every backend
updates the same way. A backend may subclass them (FSDP overrides the data-parallel and checkpoint
parts).

Module conventions (Hugging Face style): ``module(input_ids=, attention_mask=, position_ids=)``
returns an object with ``.logits``: ``(B, T, V)`` for a policy, ``(B, T, 1)`` for a value model.
"""

from __future__ import annotations

import inspect
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import torch

from .algos import (compute_entropy_loss, compute_kl_loss, compute_policy_loss, compute_value_loss,
                    entropy_from_logits, logprobs_from_logits, masked_mean)
from .batch import RLBatch
from .config import Config, OptimConfig
from .errors import ConfigError, UserError


class NonFiniteError(UserError):
    """A loss or gradient was NaN/inf; the optimizer did not step (often a learning rate that is too high)."""


@attrs.define
class Workers:
    tokenizer: Any
    """Hugging Face-like: encode(text), decode(ids, skip_special_tokens=True), pad_token_id, eos_token_id."""
    actor: TorchActor
    reference: TorchActor | None = None
    critic: TorchCritic | None = None


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


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_updates: int):
    """Linear warm-up, then constant / cosine / linear decay to min_lr_ratio at the last update."""
    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_updates - cfg.warmup_steps))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def model_inputs(batch: RLBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Prompt + response as one sequence, with padding columns shared by every row trimmed.

    Returns input_ids (B, P'+R'), attention_mask, position_ids and R' (the trimmed response width).
    """
    prompt_mask, response_mask = batch["prompt_mask"], batch["response_mask"]
    first = int(prompt_mask.any(0).nonzero()[0]) if prompt_mask.any() else prompt_mask.shape[1] - 1
    width = int(response_mask.any(0).nonzero()[-1]) + 1 if response_mask.any() else 1
    ids = torch.cat([batch["prompts"][:, first:], batch["responses"][:, :width]], dim=1)
    mask = torch.cat([prompt_mask[:, first:], response_mask[:, :width].to(prompt_mask.dtype)], dim=1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids, width


def _pad_right(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


class _TorchWorker:
    """Shared parts of actor and critic: device, optimizer, data-parallel sums, checkpoints."""

    def __init__(self, module: torch.nn.Module, config: Config, optim: OptimConfig | None,
                 mini_batch_prompts: int, epochs: int, device: torch.device | str = "cpu"):
        self.module = module
        self.config = config
        self.device = torch.device(device)
        self.optim_cfg = optim
        self.optimizer = self.scheduler = None
        if optim is not None:
            params = [p for p in module.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas),
                                               weight_decay=optim.weight_decay)
            updates_per_step = epochs * (config.data.batch_size // mini_batch_prompts)
            self.scheduler = build_scheduler(self.optimizer, optim, config.trainer.total_steps * updates_per_step)
        else:
            module.requires_grad_(False)

    # data parallel: a single process is a world of one; FSDP overrides these two.
    @property
    def dp_size(self) -> int:
        return 1

    def global_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of `value` over data-parallel ranks (normalisers must count the whole mini-batch)."""
        return value

    def clip_and_step(self, nonfinite_loss: bool) -> float:
        """Clip the global grad norm, then step unless anything is non-finite. Returns the norm."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = self.optim_cfg.grad_clip or float("inf")
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

    def minibatches(self, batch: RLBatch, mini_prompts: int, micro_rows: int):
        """Yield (micro-batches, normalisers) per mini-batch; rows stay in order so runs are reproducible."""
        rows_per_prompt = self.config.rollout.n
        for mini in batch.split(mini_prompts * rows_per_prompt // self.dp_size or len(batch)):
            mask = mini["response_mask"]
            # normalisers count the whole mini-batch (all ranks), so micro-batch losses sum to its loss
            norms = {"num_tokens": float(self.global_sum(mask.sum())),
                     "num_seqs": float(self.global_sum((mask.sum(-1) > 0).sum().float()))}
            yield mini.split(micro_rows or len(mini)), norms

    # checkpoints: safetensors for weights, weights-only torch.save for optimizer state, JSON for the rest
    def save(self, path: Path) -> None:
        from safetensors.torch import save_model
        path.mkdir(parents=True, exist_ok=True)
        save_model(self.module, str(path / "model.safetensors"))
        if self.optimizer is not None:
            torch.save(self.optimizer.state_dict(), path / "optimizer.pt")
            (path / "scheduler.json").write_text(json.dumps(self.scheduler.state_dict()))

    def load(self, path: Path) -> None:
        from safetensors.torch import load_model
        load_model(self.module, str(path / "model.safetensors"), device=str(self.device))
        if self.optimizer is not None:
            self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True,
                                                      map_location=self.device))
            self.scheduler.load_state_dict(json.loads((path / "scheduler.json").read_text()))


class TorchActor(_TorchWorker):
    """A policy (trainable) or reference (frozen) over a causal LM module."""

    def __init__(self, module: torch.nn.Module, config: Config, *, trainable: bool = True,
                 device: torch.device | str = "cpu"):
        super().__init__(module, config, config.actor if trainable else None, config.actor_mini_batch_size,
                         config.actor.ppo_epochs, device)
        self.temperature = config.rollout.temperature
        # transformers models can run the LM head on the last positions only: the prompt's logits
        # (B, P, V) are never needed, and at a real vocabulary they are most of the head's cost
        self.keeps_logits = "logits_to_keep" in inspect.signature(module.forward).parameters

    def forward(self, batch: RLBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of the response tokens at the rollout temperature, and optionally entropy."""
        # trimmed on the host, then only the model's inputs travel to the device (once)
        ids, mask, pos, width = (x if isinstance(x, int) else x.to(self.device) for x in model_inputs(batch))
        keep = {"logits_to_keep": width + 1} if self.keeps_logits else {}
        logits = self.module(input_ids=ids, attention_mask=mask, position_ids=pos, **keep).logits
        logits = logits[:, -width - 1:-1].float()  # (B, R', V): logits predicting each response token
        if self.temperature != 1.0:
            logits = logits / self.temperature
        responses = ids[:, -width:]
        log_probs = logprobs_from_logits(logits, responses)
        entropy = entropy_from_logits(logits) if with_entropy else None
        full = batch["responses"].shape[1]
        return _pad_right(log_probs, full), (_pad_right(entropy, full) if entropy is not None else None)

    @torch.no_grad()
    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) log pi(response token), zero on padding."""
        micro = self.config.actor.micro_batch_size or len(batch)
        parts = [self.forward(mb)[0] for mb in batch.split(micro)]
        return torch.cat(parts).cpu() * batch["response_mask"]

    def update(self, batch: RLBatch) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) split into micro-batches."""
        cfg = self.config.actor
        scale = cfg.loss_scale_factor or self.config.rollout.max_new_tokens
        sums: dict[str, list[float]] = defaultdict(list)
        self.module.train()
        for _ in range(cfg.ppo_epochs):
            for micro_batches, norms in self.minibatches(batch, self.config.actor_mini_batch_size, cfg.micro_batch_size):
                total, finite = 0.0, True
                for mb in micro_batches:
                    mask = mb["response_mask"].to(self.device)
                    log_prob, entropy = self.forward(mb, with_entropy=cfg.entropy_coeff != 0)
                    # no old_log_probs: a single on-policy step (see Trainer), pi_old is this forward's policy
                    old = mb["old_log_probs"].to(self.device) if "old_log_probs" in mb else log_prob.detach()
                    loss, metrics = compute_policy_loss(
                        old, log_prob, mb["advantages"].to(self.device), mask,
                        clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                        clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode, policy_loss=cfg.policy_loss,
                        log_ratio_clamp=cfg.log_ratio_clamp, loss_scale_factor=scale, **norms)
                    if entropy is not None:
                        ent = compute_entropy_loss(entropy, mask, cfg.loss_agg_mode, loss_scale_factor=scale, **norms)
                        loss = loss - cfg.entropy_coeff * ent
                        sums["actor/entropy"].append(float(masked_mean(entropy.detach(), mask)))
                    if cfg.use_kl_loss:
                        kl = compute_kl_loss(log_prob, mb["ref_log_probs"].to(self.device), mask, cfg.kl_loss_type,
                                             cfg.loss_agg_mode, loss_scale_factor=scale, **norms)
                        loss = loss + cfg.kl_loss_coef * kl
                        sums["actor/kl_loss"].append(float(kl.detach()))
                    finite &= bool(torch.isfinite(loss))
                    (loss * self.dp_size).backward()  # FSDP averages gradients over ranks; undo that
                    total += float(loss.detach())
                    for key, value in metrics.items():
                        sums[key].append(float(value))
                sums["actor/loss"].append(total)
                sums["actor/grad_norm"].append(self.clip_and_step(not finite))
                sums["actor/lr"].append(self.scheduler.get_last_lr()[0])
        return {k: sum(v) / len(v) for k, v in sums.items()}


class TorchCritic(_TorchWorker):
    """A value model: module(...).logits is (B, T, 1); values are read at the state before each response token."""

    def __init__(self, module: torch.nn.Module, config: Config, device: torch.device | str = "cpu"):
        super().__init__(module, config, config.critic, config.critic_mini_batch_size,
                         config.critic.ppo_epochs, device)

    def forward(self, batch: RLBatch) -> torch.Tensor:
        ids, mask, pos, width = (x if isinstance(x, int) else x.to(self.device) for x in model_inputs(batch))
        values = self.module(input_ids=ids, attention_mask=mask, position_ids=pos).logits[..., 0].float()
        return _pad_right(values[:, -width - 1:-1], batch["responses"].shape[1])

    @torch.no_grad()
    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        """(B, R) value estimates, zero on padding."""
        micro = self.config.critic.micro_batch_size or len(batch)
        return torch.cat([self.forward(mb) for mb in batch.split(micro)]).cpu() * batch["response_mask"]

    def update(self, batch: RLBatch) -> dict[str, float]:
        cfg = self.config.critic
        sums: dict[str, list[float]] = defaultdict(list)
        self.module.train()
        for _ in range(cfg.ppo_epochs):
            for micro_batches, norms in self.minibatches(batch, self.config.critic_mini_batch_size, cfg.micro_batch_size):
                finite = True
                for mb in micro_batches:
                    mask = mb["response_mask"].to(self.device)
                    vpreds = self.forward(mb)
                    loss, metrics = compute_value_loss(
                        vpreds, mb["returns"].to(self.device), mb["values"].to(self.device), mask,
                        cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode, **norms)
                    finite &= bool(torch.isfinite(loss))
                    (loss * self.dp_size).backward()
                    for key, value in metrics.items():
                        sums[key].append(float(value))
                sums["critic/grad_norm"].append(self.clip_and_step(not finite))
                sums["critic/lr"].append(self.scheduler.get_last_lr()[0])
        return {k: sum(v) / len(v) for k, v in sums.items()}


