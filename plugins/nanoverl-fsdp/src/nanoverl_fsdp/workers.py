"""Worker `fsdp`: policy, reference and value model sharded with FSDP2 (`fully_shard`), one rank per process.

The models are built exactly as the `hf` worker builds them (nanoverl_hf.models), then each decoder
layer and the root are wrapped with `fully_shard` over all ranks. The workers are the core's
TorchActor / TorchCritic with `parallel=FSDPParallel(...)` (parallel.py: row shards, cross-rank sums,
the global clip decision; checkpoint.py: per-rank safetensors and weights-only optimizer files, and
what `python -m nanoverl_fsdp.export` needs to rebuild a plain model).

LoRA ([model.lora]): the peft models of nanoverl_hf.lora are sharded the same way and the workers get
`weights=LoraWeights()` next to FSDPParallel: checkpoints and the optimizer hold only what trains
(adapter, value head), full_tensors() yields merged weights (gathered), and the reference is the
sharded actor run with its adapter disabled.

Mixed precision: parameters are stored (and optimised) in `model.dtype`; forward / backward run in
`[worker.fsdp] param_dtype` and gradients are reduced in `reduce_dtype` (FSDP2 MixedPrecisionPolicy),
or, with param_dtype left at model.dtype, under `model.compute_dtype`'s autocast as with the hf worker
(the two set differently are refused at config check: `check_precision`).
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from nanoverl_core import TorchActor, TorchCritic, Workers
from nanoverl_core.config import Config, settings_or_defaults
from nanoverl_core.workers import resolve_device
from nanoverl_hf.models import DTYPES, build_modules, check_model_source, resolve_source

from . import parallel
from .export import export_checkpoint
from .parallel import FSDPParallel
from .settings import FSDPSettings, check_precision

log = logging.getLogger("nanoverl_fsdp")


def shard(module: torch.nn.Module, config: Config, device: torch.device) -> torch.nn.Module:
    """fully_shard each transformer block (the classes in `_no_split_modules`), then the root.

    The root unit keeps the embeddings and the head, so tied input / output embeddings stay one
    parameter. Gathering a block's weights just before it runs and freeing them after is what lets
    a model larger than one device train; on a tiny model it only costs collectives.
    """
    mesh = init_device_mesh(device.type, (parallel.world_size(),))
    settings = settings_or_defaults(config.worker.settings, FSDPSettings)
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
    tokenizer, policy, reference, critic, teacher = build_modules(config, source)
    log.info("fsdp: %d ranks, device %s, %s", parallel.world_size(), device, config.worker.settings)
    lora = None
    if config.model.lora.enable:                    # the peft models of nanoverl_hf.lora, sharded like any module
        from nanoverl_hf.lora import LoraWeights
        lora = LoraWeights()
    actor = TorchActor(shard(policy, config, device), config, device=device,
                       parallel=FSDPParallel(export_tokenizer=tokenizer), weights=lora)
    if lora is not None:                            # the sharded actor with its adapter off
        reference = lora.reference(actor) if config.reference.enable else None
    elif reference is not None:
        reference = TorchActor(shard(reference, config, device), config, trainable=False, device=device,
                               parallel=FSDPParallel())
    if teacher is not None:                         # frozen, sharded like the reference
        teacher = TorchActor(shard(teacher, config, device), config, trainable=False, device=device,
                             parallel=FSDPParallel())
    return Workers(tokenizer=tokenizer, actor=actor, reference=reference, teacher=teacher,
                   critic=TorchCritic(shard(critic, config, device), config, device=device, parallel=FSDPParallel(),
                                      weights=lora) if critic is not None else None)


def check_config(config: Config) -> None:
    """Before any write: the mixed-precision keys agree (settings.check_precision), model.path (and gguf) usable."""
    check_precision(config)
    check_model_source(config)


make_workers.export_checkpoint = export_checkpoint  # what `nanoverl-train export` calls for this worker
make_workers.supports_lora = True                   # [model.lora], as the hf worker (nanoverl_hf.lora)
make_workers.check_config = check_config           # compute_dtype vs param_dtype, model.path, gguf: before any write
