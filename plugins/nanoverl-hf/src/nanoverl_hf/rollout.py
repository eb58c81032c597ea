"""Rollout `hf`: batched `model.generate` over left-padded prompts, with a KV cache.

Weights: when the actor's module is a plain transformers model in this process (the `hf` worker),
the rollout generates with that very module, so it always sees the current weights and
`sync_weights` costs nothing. Otherwise (a sharded FSDP module, say) it keeps its own copy and
`sync_weights` loads the actor's full state dict into it.

Shared prompt prefixes: GRPO repeats every prompt rollout.n times, and prefilling n copies of a prompt is
n times the work (for ~40-token prompts and 32 new tokens, a large share of the rollout's FLOPs). So each
micro-batch runs every distinct prompt but its last token once, copies that KV cache to the rows that
repeat it, and lets generate continue from it (feeding each row only its last prompt token).
`[rollout.hf] share_prompts = false` turns this off (settings.py).

Precision: with `model.compute_dtype` set, prefill and decoding run under the same autocast as the
actor's log-prob passes (the sampler reads float32 scores either way).

Sampling follows the rollout.* keys only: the model's generation_config.json defaults (repetition
penalty, top_k=50, ...) are replaced by a neutral config when the worker loads the model.
"""

from __future__ import annotations

import torch

from nanoverl_core import RLBatch, SamplingParams, responses_to_batch
from nanoverl_core.config import Config
from nanoverl_core.rollout import stop_token_ids
from nanoverl_core.workers import autocast, cache_keyword, forward_keyword, prompt_cache

from .models import load_policy, neutral_generation_config, resolve_source
from .settings import HFRolloutSettings


def _is_sharded(module: torch.nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in module.parameters())  # DTensor (FSDP2 / TP)


class InverseCDFSampler:
    """A logits processor that samples: one uniform number per row, looked up in the cumulative
    softmax, and scores that are 0 at the drawn token and -inf elsewhere, so generate's argmax
    (do_sample=False) returns it. The distribution is softmax(scores) exactly as with do_sample=True.

    Why: on CPU torch.multinomial draws one exponential number per vocabulary entry per row (an
    exponential race); at a 4k vocabulary that is ~12 ms per decode step for 64 rows and at 152k
    ~0.5 s, 2.5 to 5 times this lookup. Used on CPU only; GPUs keep transformers' own sampling.
    """

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        cdf = torch.softmax(scores.float(), dim=-1).cumsum_(-1)                        # (B, V)
        u = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
        token = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)   # (B, 1)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)   # scores stay untouched


class HFRollout:
    returns_log_probs = False
    """generate() adds no rollout_log_probs (its CPU sampler's scores are not log-probs)."""

    def __init__(self, config: Config, workers, *, share: bool | None = None):
        """`share=None` shares the actor's module whenever that is safe; tests force either mode."""
        self.config = config
        settings = config.rollout.settings
        if not isinstance(settings, HFRolloutSettings):  # a config of another rollout (vllm's tests compare)
            settings = HFRolloutSettings()
        self.share_prefix = settings.share_prompts
        """Prefill each distinct prompt once per micro-batch (see the module docstring); False: plain generate."""
        self.tokenizer = workers.tokenizer
        actor = workers.actor
        self.device = actor.device
        self.shared = (hasattr(actor.module, "generate") and not _is_sharded(actor.module)) if share is None \
            else share
        if self.shared:
            self.module = actor.module
        else:
            self.module = load_policy(config, resolve_source(config.model)).to(self.device)
            self.module.generation_config = neutral_generation_config(
                self.module, self.tokenizer, stop_token_ids(self.tokenizer, actor.module))
            self.module.requires_grad_(False)
            self.sync_weights(actor)
        self.eos_token_ids = stop_token_ids(self.tokenizer, self.module)
        self.cache_keyword = cache_keyword(self.module)                    # None: the model takes no KV cache
        self.keeps_logits = forward_keyword(self.module, "logits_to_keep") is not None
        self._gen_configs: dict[SamplingParams, object] = {}

    def sync_weights(self, actor) -> None:
        """Shared module: nothing to do. Own copy: copy the actor's full tensors in, one at a time."""
        if self.shared and self.module is actor.module:
            return
        own = self.module.state_dict()
        with torch.no_grad():
            for name, tensor in actor.full_tensors():   # a collective under torchrun: consumed whole on every rank
                own[name].copy_(tensor)                 # casts dtype, moves device

    def close(self) -> None:
        """Drop the own copy; a shared module is the actor's."""
        if not self.shared:
            self.module = None

    def _generation_config(self, params: SamplingParams):
        """Every sampling knob set explicitly, so nothing falls back to a checkpoint's defaults."""
        if params not in self._gen_configs:
            from transformers import GenerationConfig

            base = self.module.generation_config
            sampling = {} if params.greedy else {"temperature": params.temperature, "top_p": params.top_p,
                                                 "top_k": params.top_k}
            self._gen_configs[params] = GenerationConfig(
                max_new_tokens=params.max_new_tokens, do_sample=not params.greedy, num_beams=1, use_cache=True,
                eos_token_id=self.eos_token_ids, pad_token_id=self.tokenizer.pad_token_id,
                bos_token_id=base.bos_token_id, **sampling)
        return self._gen_configs[params]

    def _cpu_sampling(self, params: SamplingParams):
        """The same sampling as _generation_config(params), drawn by InverseCDFSampler: a greedy
        config plus the temperature / top-k / top-p warpers (in transformers' order) and the sampler."""
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                            TopPLogitsWarper)

        if ("cpu", params) in self._gen_configs:
            return self._gen_configs["cpu", params]
        config = self._generation_config(params)
        greedy = GenerationConfig(max_new_tokens=config.max_new_tokens, do_sample=False, num_beams=1, use_cache=True,
                                  eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                                  bos_token_id=config.bos_token_id)
        warpers = ([TemperatureLogitsWarper(params.temperature)] if params.temperature != 1.0 else []) \
            + ([TopKLogitsWarper(params.top_k)] if params.top_k else []) \
            + ([TopPLogitsWarper(params.top_p)] if params.top_p < 1.0 else [])
        self._gen_configs["cpu", params] = greedy, LogitsProcessorList([*warpers, InverseCDFSampler()])
        return self._gen_configs["cpu", params]

    def _prefix_cache(self, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        """generate's cache argument: every row's prompt but its last token in a KV cache, each distinct prompt
        computed once (nanoverl_core.workers.prompt_cache). {} (a plain generate) when no row repeats, the
        prompt is one column wide, or the model takes no cache."""
        name = self.cache_keyword
        if not self.share_prefix or name is None or ids.shape[1] < 2 or len(torch.unique(ids, dim=0)) == len(ids):
            return {}
        cache = prompt_cache(self.module, name, ids[:, :-1], mask[:, :-1], self.keeps_logits)
        return {} if cache is None else {name: cache}

    @torch.no_grad()
    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        """One response per row, rows in order; `rollout.micro_batch_size` rows per generate call."""
        prompts, prompt_mask = batch["prompts"], batch["prompt_mask"]           # (B, P), left-padded
        micro = self.config.rollout.micro_batch_size or len(batch)
        gen_config, processors = self._generation_config(params), None
        if self.device.type == "cpu" and not params.greedy:
            gen_config, processors = self._cpu_sampling(params)
        was_training = self.module.training
        self.module.eval()
        responses: list[torch.Tensor] = []
        try:
            for start in range(0, len(batch), micro):
                mask = prompt_mask[start:start + micro]
                first = int(mask.any(0).int().argmax())                          # drop all-padding columns
                ids = prompts[start:start + micro, first:].to(self.device)
                mask = mask[:, first:].to(self.device)
                with autocast(self.config.model, self.device):          # model.compute_dtype, as the actor's passes
                    out = self.module.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config,
                                               logits_processor=processors, **self._prefix_cache(ids, mask))
                responses.append(out[:, ids.shape[1]:].cpu())                    # (b, R) new tokens: one copy
        finally:
            self.module.train(was_training)
        width = max(r.shape[1] for r in responses)                               # calls may stop at different R
        pad = self.tokenizer.pad_token_id
        responses = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=pad) for r in responses])
        return responses_to_batch(responses, eos_token_id=self.eos_token_ids,
                                  pad_token_id=self.tokenizer.pad_token_id, max_new_tokens=params.max_new_tokens)


def make_rollout(config: Config, workers) -> HFRollout:
    return HFRollout(config, workers)
