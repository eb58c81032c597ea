"""`nanoverl-train export` for the hf worker: a checkpoint's policy as a plain save_pretrained folder.

The checkpoint holds the policy's weights (`actor/model.safetensors`); the architecture and the
tokenizer come from the run's `model.path`, exactly as the worker built them, so the folder loads
with `AutoModelForCausalLM.from_pretrained` (and in vLLM) and gives the trained policy's logits.
"""

from __future__ import annotations

from pathlib import Path

from nanoverl_core.config import Config
from nanoverl_core.workers import checkpoint_fits

from .models import load_policy, load_tokenizer, neutral_generation_config, resolve_source


def export_checkpoint(checkpoint: Path, out: Path, config: Config) -> None:
    """Write checkpoint/actor's policy, with its config, generation config and tokenizer, to `out`."""
    from nanoverl_core.rollout import stop_token_ids
    from safetensors.torch import load_model

    source = resolve_source(config.model)
    tokenizer = load_tokenizer(config.model, source)
    model = load_policy(config, source)
    with checkpoint_fits(checkpoint):   # another architecture's weights: a CheckpointError naming the folder
        load_model(model, str(checkpoint / "actor" / "model.safetensors"))
    model.generation_config = neutral_generation_config(model, tokenizer, stop_token_ids(tokenizer, model))
    model.config.use_cache = True       # training turned the KV cache off; generation wants it
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
