"""[rollout.vllm]: the engine's own settings (no vLLM or torch import: checking a config stays fast)."""

import attrs

from nanoverl_core.config import above, at_least, between, settings_or_defaults

LORA_SYNC = ("merged", "adapter")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM 0.32 accepts (vllm.config.lora.MaxLoRARanks)."""


@attrs.define
class VLLMSettings:
    gpu_memory_utilization: float = attrs.field(default=0.5, validator=between(0, 1, low_open=True))
    """Fraction of accelerator memory the engine may take (weights + KV cache); ignored on CPU."""
    log_probs: bool = True
    """Return `rollout_log_probs`, vLLM's log-prob of each sampled token: the rollout-mismatch metrics
    (`rollout_corr/*`) and algorithm.rollout_correction need them (the metrics compare them with the
    on-policy update's own forward; correction adds a separate old-log-prob pass). false: no engine
    log-probs, no mismatch metrics."""
    max_num_seqs: int = attrs.field(default=0, validator=at_least(0))
    """Sequences the engine runs at once (vLLM's `max_num_seqs`). 0: on CPU, the rows of one training
    generate call (data.batch_size x rollout.n, at least 64), with the KV cache sized for that many
    sequences of full length (so none is ever preempted), and validation batches with more rows run in
    waves; on a GPU, vLLM's own default. Raise it to run larger validation batches at once, for
    more KV cache memory."""
    release_kv_cache: bool = True
    """On CPU, where vLLM has no sleep mode, with the engine in the trainer's process (the default): after
    each batch (each batch of multi-turn episodes), drop the prefix cache and give the KV cache's pages
    back to the OS, so the update does not hold them too. The next batch faults in the pages it uses.
    false: the cache stays resident for the whole run. (On a GPU the engine sleeps between batches
    instead.)"""
    lora_sync: str = attrs.field(default="merged", validator=attrs.validators.in_(LORA_SYNC))
    """With [model.lora] enable = true, what each weight sync sends the engine. "merged" (default):
    every weight, adapted ones as W + alpha/r * B @ A, streamed into a plain engine (no vLLM LoRA
    involved). "adapter": the engine holds the frozen base once (`enable_lora`, `max_loras = 1`) and each
    sync writes only the adapter (a peft save_pretrained folder) and loads it as a new `LoRARequest`;
    not for an adapted input embedding. Without LoRA only "merged" applies."""
    timeout_s: float = attrs.field(default=1800.0, validator=above(0))
    """The deadline of one call into the engine (a generate, a weight sync). With the engine core in its
    own process (VLLM_ENABLE_V1_MULTIPROCESSING=1), a core that dies or stops answering mid-call is
    killed and the engine restarted from the actor's weights (a second failure stops the run); in-process
    (the default) a call past its deadline stops the run with one line (rerun to resume)."""


def lora_rank_limit(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    return next(limit for limit in VLLM_LORA_RANKS if limit >= rank)


def check_config(config) -> None:
    """[rollout.vllm] lora_sync combinations vLLM's LoRA cannot serve, as ConfigErrors (before any model loads)."""
    from nanoverl_core import ConfigError

    settings = settings_or_defaults(config.rollout.settings, VLLMSettings)
    if settings.lora_sync != "adapter":
        return
    lora = config.model.lora
    key = 'rollout.vllm.lora_sync = "adapter"'
    if not lora.enable:
        raise ConfigError(f"{key} sends a LoRA adapter, but model.lora.enable = false; set model.lora.enable = true, "
                          'or lora_sync = "merged" (valid choices: merged, adapter)')
    if lora.rank > VLLM_LORA_RANKS[-1]:
        raise ConfigError(f"{key}: model.lora.rank = {lora.rank} exceeds vLLM's largest max_lora_rank "
                          f"({VLLM_LORA_RANKS[-1]}); lower model.lora.rank or set lora_sync = \"merged\"")
    if lora.target_modules != "all-linear":
        embeddings = [t for t in lora.target_modules if "embed" in t.split(".")[-1] or t.split(".")[-1] == "wte"]
        if embeddings:
            raise ConfigError(f"{key} cannot serve an adapted embedding (model.lora.target_modules has "
                              f"{embeddings[0]!r}; vLLM's LoRA takes linear layers only); drop it from "
                              'model.lora.target_modules, or set lora_sync = "merged"')
