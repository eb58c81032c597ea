"""Worker `fsdp`: policy, reference and value model sharded with FSDP2 (`fully_shard`), one rank per process.

The models are built exactly as the `hf` worker builds them (nanoverl_hf.models), then each decoder
layer and the root are wrapped with `fully_shard` over all ranks. The PPO mechanics are the core's
TorchActor / TorchCritic; the classes here override only what data parallelism changes:

  - rows: every rank holds the whole step batch; log-probs and values are computed on this rank's
    share of the rows and gathered back (parallel.rank_rows / gather_rows); an update takes this rank's
    share of every mini-batch, so the ranks together see exactly the mini-batches one process would;
  - normalisers: each mini-batch's token / sequence totals are counted on the whole mini-batch
    (every rank has it), and the core scales each micro-batch loss by dp_size before backward
    because FSDP averages gradients over ranks: the summed gradient equals one process's;
  - clipping: `clip_grad_norm_` over the DTensor gradients returns the global norm (the core calls
    `full_tensor()`); a non-finite loss on any rank skips the step on every rank;
  - metrics: each rank's are its share of the mini-batch's; the core's update sums them over ranks;
  - checkpoints: every rank writes its own shards into the trainer's temporary folder, as
    safetensors (model) and a weights-only torch.save file (optimizer), nothing pickled; rank 0
    adds shards.json (world size, each tensor's shape and sharded dim) and the transformers config
    and tokenizer, so that `python -m nanoverl_fsdp.export` can rebuild a plain model from the folder.

LoRA ([model.lora]): the peft models of nanoverl_hf.lora are sharded the same way; checkpoints and
the optimizer hold only what trains (adapter, value head), full_tensors() yields merged weights
(gathered), and the reference is the sharded actor run with its adapter disabled.

Mixed precision: parameters are stored (and optimised) in `model.dtype`; forward / backward run in
`[worker.fsdp] param_dtype` and gradients are reduced in `reduce_dtype` (FSDP2 MixedPrecisionPolicy).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from nanoverl_core import RLBatch, TorchActor, TorchCritic, Workers
from nanoverl_core.algos import loss_totals
from nanoverl_core.config import Config
from nanoverl_core.errors import CheckpointMismatch
from nanoverl_core.workers import (checkpoint_fits, load_scheduler, load_tensors, resolve_device, save_scheduler,
                                   save_tensors)
from nanoverl_hf.models import DTYPES, build_modules, check_model_source, resolve_source

from . import parallel
from .export import MODEL_FILE, SHARDS, export_checkpoint
from .settings import FSDPSettings

log = logging.getLogger("nanoverl_fsdp")

HF_FILES = "hf"
"""Sub-folder of a saved actor holding config.json, generation_config.json and the tokenizer."""
OPTIMIZER_FILE = "optimizer_rank{rank}.pt"
"""Each rank's optimizer state (its shards, numbers, strings), next to MODEL_FILE and (rank 0) SHARDS."""


def _local(tree):
    """`tree` (nested dicts / lists) with every tensor replaced by a CPU copy of this rank's shard."""
    if isinstance(tree, dict):
        return {k: _local(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_local(v) for v in tree)
    if isinstance(tree, torch.Tensor):
        return (tree.to_local() if isinstance(tree, DTensor) else tree).detach().to("cpu", copy=True)
    return tree


def _fill(into, saved, where: str = ""):
    """Copy `saved` (as _local wrote it) into the same-shaped tree `into`: tensors in place (a DTensor
    into its local shard), other values (learning rates, betas, ...) replaced. Returns the filled tree."""
    if isinstance(into, dict):
        if not isinstance(saved, dict) or into.keys() != saved.keys():
            raise CheckpointMismatch(f"checkpoint entry {where or '/'} does not match the model or optimizer")
        return {k: _fill(into[k], saved[k], f"{where}/{k}") for k in into}
    if isinstance(into, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(into) != len(saved):
            raise CheckpointMismatch(f"checkpoint entry {where} does not match the model or optimizer")
        return type(into)(_fill(a, b, f"{where}/{i}") for i, (a, b) in enumerate(zip(into, saved)))
    if isinstance(into, torch.Tensor):
        local = into.to_local() if isinstance(into, DTensor) else into
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape:
            raise CheckpointMismatch(f"checkpoint entry {where}: shape {getattr(saved, 'shape', None)}, "
                             f"this rank's shard is {tuple(local.shape)}")
        local.copy_(saved)
        return into
    return saved


class _Sharded:
    """Data-parallel parts shared by FSDPActor and FSDPCritic (mixed in before the core class)."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    config: Config
    cached_backward = False
    """The log-prob and value passes share prompt caches ([actor] share_prompts); training passes run every
    row whole: FSDP2 frees a unit's gathered weights after each forward, and the backward of a first
    (prompt) forward followed by a second one before backward finds them gone."""

    # ---- data parallel: the hooks the core's update loop calls ------------------------------------
    @property
    def dp_size(self) -> int:
        return parallel.world_size()

    def global_sum(self, value: torch.Tensor) -> torch.Tensor:
        return parallel.all_reduce_sum(value)

    def global_max(self, value: int) -> int:
        out = torch.tensor(value)
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.MAX)
        return int(out)

    def minibatches(self, batch: RLBatch, mini_prompts: int):
        """Per mini-batch of the whole batch: this rank's share split into micro-batches, and the
        normalisers of the whole mini-batch. Fill rows get an all-zero loss mask: no loss, no metric."""
        for mini in batch.split(mini_prompts * self.config.rollout.n or len(batch)):
            norms = loss_totals(mini["loss_mask"])         # every rank holds the whole mini-batch
            rows, real = parallel.rank_rows(len(mini))
            local = mini.index(rows)
            if real < len(rows):
                mask = local["loss_mask"].clone()
                mask[real:] = 0
                local["loss_mask"] = mask
            yield [local.index(rows) for rows in self.micro_batches(local)], norms

    def clip_and_step(self, nonfinite_loss: bool) -> float:
        # every rank must take the same decision, or the next collective waits forever
        anywhere = self.global_sum(torch.tensor(float(nonfinite_loss))) > 0
        return super().clip_and_step(bool(anywhere))

    def _on_my_rows(self, compute, batch: RLBatch) -> torch.Tensor:
        """compute(rows) -> (rows, R) on this rank's share; all rows gathered: (B, R) on the CPU."""
        rows, _ = parallel.rank_rows(len(batch))
        return parallel.gather_rows(compute(batch.index(rows)), len(batch))

    # ---- checkpoints: called on every rank with the same path; nothing is pickled -----------------
    # Each rank saves its own shards (DTensor.to_local()) and loads them back into the same DTensors,
    # so a checkpoint resumes on the same number of ranks only. The trainer's barrier after save
    # makes the folder complete before rank 0 renames it.
    def _options(self, load: bool = False) -> StateDictOptions:
        """A LoRA worker (`lora = True`) saves and loads what trains (adapter, value head), not the frozen base."""
        lora = getattr(self, "lora", False)
        return StateDictOptions(ignore_frozen_params=lora, strict=not (load and lora))

    def _state(self) -> dict:
        if self.optimizer is None:
            return {"model": self._trainable(get_model_state_dict(self.module, options=self._options()))}
        model, optimizer = get_state_dict(self.module, self.optimizer, options=self._options())   # creates Adam's state if still empty
        return {"model": self._trainable(model), "optimizer": optimizer}

    def _trainable(self, model: dict) -> dict:
        """LoRA: drop what ignore_frozen_params keeps of the base (a tied lm_head is not a parameter name)."""
        if not getattr(self, "lora", False):
            return model
        trainable = {name for name, p in self.module.named_parameters() if p.requires_grad}
        return {name: value for name, value in model.items() if name in trainable}

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        state, me = self._state(), parallel.rank()
        save_file(_local(state["model"]), str(path / MODEL_FILE.format(rank=me)))
        if "optimizer" in state:                            # plain tensors, numbers, strings: weights_only loads it
            save_tensors(_local(state["optimizer"]), path / OPTIMIZER_FILE.format(rank=me))
        if me == 0:
            model = {name: {"shape": list(value.shape), "shard_dim": _shard_dim(value)}
                     for name, value in state["model"].items()}
            (path / SHARDS).write_text(json.dumps({"world_size": parallel.world_size(), "model": model,
                                                   "lora": getattr(self, "lora", False)}))
            if getattr(self, "lora", False):                # adapter_config.json, as peft writes it
                self.module.peft_config["default"].save_pretrained(str(path))
            if self.scheduler is not None:
                save_scheduler(path, self.scheduler)

    @torch.no_grad()
    def load(self, path: Path) -> None:
        world, me = parallel.world_size(), parallel.rank()
        saved_world = json.loads((path / SHARDS).read_text())["world_size"]
        if saved_world != world:
            raise CheckpointMismatch(f"{path} was saved by {saved_world} ranks; resume it on {saved_world} ranks, not {world}")
        state = self._state()
        with checkpoint_fits(path):
            model = _fill(state["model"], load_file(str(path / MODEL_FILE.format(rank=me))), "model")
            if self.optimizer is None:
                set_model_state_dict(self.module, model, options=self._options(load=True))
            else:
                optimizer = load_tensors(path / OPTIMIZER_FILE.format(rank=me))
                set_state_dict(self.module, self.optimizer, model_state_dict=model,
                               optim_state_dict=_fill(state["optimizer"], optimizer, "optimizer"),
                               options=self._options(load=True))
            if self.scheduler is not None:
                load_scheduler(path, self.scheduler)

class FSDPActor(_Sharded, TorchActor):
    """A sharded policy (trainable) or reference (frozen)."""

    def __init__(self, module: torch.nn.Module, config: Config, *, trainable: bool = True,
                 device: torch.device | str = "cpu", tokenizer=None):
        super().__init__(module, config, trainable=trainable, device=device)
        self.tokenizer = tokenizer

    @torch.no_grad()
    def compute_log_probs(self, batch: RLBatch) -> torch.Tensor:
        return self._on_my_rows(super().compute_log_probs, batch)

    def save(self, path: Path) -> None:
        super().save(path)
        if parallel.rank() == 0:                            # what export needs to rebuild a plain model
            self.module.config.save_pretrained(path / HF_FILES)
            self.module.generation_config.save_pretrained(path / HF_FILES)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(path / HF_FILES)


class FSDPCritic(_Sharded, TorchCritic):
    @torch.no_grad()
    def compute_values(self, batch: RLBatch) -> torch.Tensor:
        return self._on_my_rows(super().compute_values, batch)


def _shard_dim(value: torch.Tensor) -> int | None:
    """The dim an entry is split along over the ranks (in rank order); None if every rank holds it whole."""
    shards = [p.dim for p in value.placements if p.is_shard()] if isinstance(value, DTensor) else []
    return shards[0] if shards else None


def shard(module: torch.nn.Module, config: Config, device: torch.device) -> torch.nn.Module:
    """fully_shard each transformer block (the classes in `_no_split_modules`), then the root.

    The root unit keeps the embeddings and the head, so tied input / output embeddings stay one
    parameter. Gathering a block's weights just before it runs and freeing them after is what lets
    a model larger than one device train; on a tiny model it only costs collectives.
    """
    mesh = init_device_mesh(device.type, (parallel.world_size(),))
    settings = config.worker.settings or FSDPSettings()
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[settings.param_dtype], reduce_dtype=DTYPES[settings.reduce_dtype])
    blocks = set(getattr(module, "_no_split_modules", None) or ())
    module.to(device)
    for sub in module.modules():
        if sub is not module and type(sub).__name__ in blocks:
            fully_shard(sub, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    return module


def make_workers(config: Config) -> Workers:
    source = resolve_source(config.model)          # a missing path fails here, before anything loads
    device = resolve_device(config.trainer.device)
    parallel.init_process_group(device.type)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())   # cuda:LOCAL_RANK under torchrun
    # Every rank builds the same full model (same files, same seed), then keeps only its shards.
    tokenizer, policy, reference, critic = build_modules(config, source)
    log.info("fsdp: %d ranks, device %s, %s", parallel.world_size(), device, config.worker.settings)
    if config.model.lora.enable:
        return _lora_workers(config, device, tokenizer, policy, critic)
    return Workers(
        tokenizer=tokenizer,
        actor=FSDPActor(shard(policy, config, device), config, device=device, tokenizer=tokenizer),
        reference=FSDPActor(shard(reference, config, device), config, trainable=False, device=device)
        if reference is not None else None,
        critic=FSDPCritic(shard(critic, config, device), config, device=device) if critic is not None else None,
    )


make_workers.export_checkpoint = export_checkpoint  # what `nanoverl-train export` calls for this worker
make_workers.supports_lora = True                   # [model.lora], as the hf worker (nanoverl_hf.lora)
make_workers.check_config = check_model_source     # model.path, gguf: before any write


def _lora_workers(config: Config, device: torch.device, tokenizer, policy, critic) -> Workers:
    """LoRA: peft models sharded like any module; the reference is the sharded actor with its adapter off."""
    from nanoverl_hf.lora import LoraActor, LoraCritic, reference_view

    class FSDPLoraActor(FSDPActor, LoraActor):
        """Sharded peft policy: merged full_tensors (gathered), adapter-only sharded checkpoints."""

    class FSDPLoraCritic(FSDPCritic, LoraCritic):
        """Sharded peft value model: adapter and value head train, the backbone is frozen."""

    actor = FSDPLoraActor(shard(policy, config, device), config, device=device, tokenizer=tokenizer)
    return Workers(tokenizer=tokenizer, actor=actor,
                   reference=reference_view(actor, FSDPActor) if config.reference.enable else None,
                   critic=FSDPLoraCritic(shard(critic, config, device), config, device=device)
                   if critic is not None else None)
