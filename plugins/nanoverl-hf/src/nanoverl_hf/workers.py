"""Worker `hf`: policy, reference and value model on transformers modules, in one process.

The PPO mechanics (micro-batches, clipping, optimizer, checkpoints) are the core's `TorchActor` and
`TorchCritic` with their single-process default; this file only builds the modules and the
tokenizer. With [model.lora] the actor and critic get nanoverl_hf.lora's `LoraWeights` (adapter-only
optimizer and checkpoints, merged weights for rollouts) and the reference is the actor's own module
with the adapter disabled.
"""

from __future__ import annotations

from nanoverl_core import TorchActor, TorchCritic, Workers
from nanoverl_core.config import Config
from nanoverl_core.workers import resolve_device

from .export import export_checkpoint
from .models import build_modules, check_model_source, resolve_source


def make_workers(config: Config) -> Workers:
    source = resolve_source(config.model)          # a missing path fails here, before anything loads
    device = resolve_device(config.trainer.device)
    tokenizer, policy, reference, critic, teacher = build_modules(config, source)
    if config.model.lora.enable:
        from .lora import LoraWeights
        lora = LoraWeights()
        actor = TorchActor(policy.to(device), config, device=device, weights=lora)
        return Workers(tokenizer=tokenizer, actor=actor,
                       reference=lora.reference(actor) if config.reference.enable else None,
                       teacher=TorchActor(teacher.to(device), config, trainable=False, device=device) if teacher else None,
                       critic=TorchCritic(critic.to(device), config, device=device, weights=lora)
                       if critic is not None else None)
    return Workers(
        tokenizer=tokenizer,
        actor=TorchActor(policy.to(device), config, device=device),
        reference=TorchActor(reference.to(device), config, trainable=False, device=device) if reference else None,
        critic=TorchCritic(critic.to(device), config, device=device) if critic is not None else None,
        teacher=TorchActor(teacher.to(device), config, trainable=False, device=device) if teacher else None,
    )


make_workers.export_checkpoint = export_checkpoint  # what `nanoverl-train export` calls for this worker
make_workers.supports_lora = True                   # [model.lora]: nanoverl_hf.lora
make_workers.check_config = check_model_source     # model.path, gguf: before any write
