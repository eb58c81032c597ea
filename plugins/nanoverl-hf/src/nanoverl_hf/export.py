"""`nanoverl-train export` for the hf worker: a checkpoint's policy as a plain save_pretrained folder.

The checkpoint holds the policy's weights (`actor/model.safetensors`); the architecture and the
tokenizer come from the run's `model.path`, exactly as the worker built them, so the folder loads
with `AutoModelForCausalLM.from_pretrained` (and in vLLM) and gives the trained policy's logits.
A LoRA run's checkpoint holds the adapter (`actor/adapter_model.safetensors`): it is applied to the
base from `model.path` and merged (peft's merge_and_unload), so the folder is a plain model too.
"""

from __future__ import annotations

from pathlib import Path

from nanoverl_core.config import Config
from nanoverl_core.workers import MODEL_FILE, checkpoint_fits

from .models import load_policy, load_tokenizer, neutral_generation_config, resolve_source


def export_checkpoint(checkpoint: Path, out: Path, config: Config) -> None:
    """Write checkpoint/actor's policy, with its config, generation config and tokenizer, to `out`."""
    from nanoverl_core.rollout import stop_token_ids
    from safetensors.torch import load_model

    source = resolve_source(config.model)
    tokenizer = load_tokenizer(config.model, source)
    model = load_policy(config, source)
    if config.model.lora.enable:        # the base from model.path + the checkpoint's adapter, merged
        model = merged_lora_policy(model, checkpoint / "actor", config)
    else:
        with checkpoint_fits(checkpoint):   # another architecture's weights: a CheckpointError naming the folder
            load_model(model, str(checkpoint / "actor" / MODEL_FILE))
    model.generation_config = neutral_generation_config(model, tokenizer, stop_token_ids(tokenizer, model))
    model.config.use_cache = True       # training turned the KV cache off; generation wants it
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def merged_lora_policy(model, actor_dir: Path, config: Config, module_state: dict | None = None):
    """`model` (the base) with the adapter saved in `actor_dir` merged in (the weights of
    `merged_tensors`, what rollouts get): a plain transformers model again, without adapter layers. `module_state`: the adapter as the peft
    model's own state-dict entries instead (the fsdp worker's joined shards)."""
    from safetensors.torch import load_file

    from nanoverl_core.errors import CheckpointError, CheckpointMismatch

    from .lora import ADAPTER_FILE, apply_lora, load_adapter, merged_tensors

    peft_model = apply_lora(model, config)
    with checkpoint_fits(actor_dir):
        if module_state is not None:
            result = peft_model.load_state_dict(module_state, strict=False)
            trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
            if result.unexpected_keys or trainable & set(result.missing_keys):
                raise CheckpointMismatch(f"the adapter in {actor_dir} does not fit model.lora of the run's config")
        elif (actor_dir / ADAPTER_FILE).is_file():
            load_adapter(peft_model, load_file(str(actor_dir / ADAPTER_FILE)))
        else:
            raise CheckpointError(f"{actor_dir} holds no LoRA adapter ({ADAPTER_FILE}) although the run's config has "
                                  "model.lora.enable = true; the checkpoint is incomplete or from another run")
    merged = dict(merged_tensors(peft_model))   # not merge_and_unload: for an adapted embedding with a tied head
    plain = peft_model.unload()                 # peft 0.21's merge gives other weights (tests/test_lora.py)
    plain.load_state_dict(merged)
    return plain
