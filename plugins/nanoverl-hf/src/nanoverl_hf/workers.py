"""Worker `hf`: policy, reference and value model on transformers modules, in one process.

The PPO mechanics (micro-batches, clipping, optimizer, checkpoints) are the core's `TorchActor` and
`TorchCritic`; this file only builds the modules and the tokenizer.
"""

from __future__ import annotations

import copy
import logging

from nanoverl_core import TorchActor, TorchCritic, Workers
from nanoverl_core.config import Config

from .models import build_value_model, eos_token_ids, load_policy, load_tokenizer, neutral_generation_config, \
    resolve_device, resolve_source

log = logging.getLogger("nanoverl_hf")


def make_workers(config: Config) -> Workers:
    source = resolve_source(config.model)          # a missing path fails here, before anything loads
    device = resolve_device(config.trainer.device)
    tokenizer = load_tokenizer(config.model, source)
    policy = load_policy(config, source)
    policy.generation_config = neutral_generation_config(policy, tokenizer, eos_token_ids(policy, tokenizer))
    if len(tokenizer) > policy.config.vocab_size:
        log.warning("the tokenizer has %d tokens but the model's vocab_size is %d", len(tokenizer),
                    policy.config.vocab_size)

    # The reference is a frozen copy taken before any update, so it starts from identical weights.
    reference = copy.deepcopy(policy).eval() if config.reference.enable else None
    critic = build_value_model(policy, config) if config.critic.enable else None
    if config.model.gradient_checkpointing:
        for module in (policy, critic):
            if module is not None:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    return Workers(
        tokenizer=tokenizer,
        actor=TorchActor(policy.to(device), config, device=device),
        reference=TorchActor(reference.to(device), config, trainable=False, device=device) if reference else None,
        critic=TorchCritic(critic.to(device), config, device=device) if critic is not None else None,
    )
