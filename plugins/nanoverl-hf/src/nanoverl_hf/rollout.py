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

Multi-turn episodes: each turn is one generate call whose prompt is the episode so far, and prefilling it
again would make every turn cost the whole context. Inside `turn_cache()` (which the multi-turn driver,
nanoverl_core.env.EpisodeRollout, holds around one batch of episodes) the rollout keeps each row's KV cache
by its `episode_key` after every call. A row of the next call takes, of its kept cache, the part whose
tokens start its new prompt (the episode so far, left padding dropped), laid out in the new left-padded
columns; generate then prefills only the columns after those, the widest row's new tokens (the
environment's answer and the last sampled token). Keys and values at a position depend only on the tokens
up to it, so the logits are those of a prefill of the whole prompt within float rounding (1e-6 in
float32), and the sampler, drawing the same numbers, picks the same ids. Only caches of full-attention
layers are kept (a sliding window or a recurrent state cannot be cut by position: such a model prefills
every turn); the caches of episodes that ended are dropped after each call, all of them when the context
exits. `[rollout.hf] turn_cache = false` prefills every turn whole.

The KV cache grows in place: transformers' `DynamicLayer` concatenates each new position's keys and values
to the cache, which copies every layer's whole cache at every decoding step. `GrowingLayer` writes them into
buffers with room to spare (half again as much when full) and hands attention views of the filled part:
the same numbers, so the same ids.

Precision: with `model.compute_dtype` set, prefill and decoding run under the same autocast as the
actor's log-prob passes (the sampler reads float32 scores either way).

Sampling follows the rollout.* keys only: the model's generation_config.json defaults (repetition
penalty, top_k=50, ...) are replaced by a neutral config when the worker loads the model.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers.cache_utils import DynamicLayer

from nanoverl_core import RLBatch, SamplingParams, responses_to_batch
from nanoverl_core.config import Config, settings_or_defaults
from nanoverl_core.rollout import stop_token_ids
from nanoverl_core.workers import autocast, cache_keyword, forward_keyword, prompt_cache

from .models import load_policy, neutral_generation_config, resolve_source
from .settings import HFRolloutSettings


class GrowingLayer(DynamicLayer):
    """A transformers `DynamicLayer` that appends in place (see the module docstring): its `keys` and `values`
    are views of the first positions of buffers with room for more. A method that replaces them (crop,
    reorder, select rows) leaves tensors of its own, which the next update copies into new buffers.

    Under autocast the buffers hold autocast's dtype: attention (an autocast op) casts its keys and values
    to it before it reads them, so it reads the same numbers, and a float32 key (the rotary embedding
    promotes bf16 ones) is not cast again at every decoding step. Without autocast they hold the dtype
    concatenation would give."""

    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    """(keys, values) with room for more positions, or None before the first update."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # the first states go through transformers' own update (its initialisation varies by version); the
        # buffers start at the next update
        if not self.is_initialized:
            return super().update(key_states, value_states, *args, **kwargs)
        held, new = self.get_seq_length(), key_states.shape[-2]
        buffers = self.buffers
        if buffers is None or self.keys.data_ptr() != buffers[0].data_ptr() or held + new > buffers[0].shape[-2]:
            buffers = tuple(self._grown(old, states, held, held + new)
                            for old, states in ((self.keys, key_states), (self.values, value_states)))
            self.buffers = buffers
        for buffer, states in zip(buffers, (key_states, value_states)):
            buffer[..., held:held + new, :] = states
        self.keys, self.values = (buffer[..., :held + new, :] for buffer in buffers)
        return self.keys, self.values

    @staticmethod
    def _grown(old: torch.Tensor, states: torch.Tensor, held: int, needed: int) -> torch.Tensor:
        """A buffer for `needed` positions and half as many again (see the class docstring for its dtype),
        holding the `held` positions of `old`."""
        device = states.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
            torch.promote_types(old.dtype, states.dtype) if held else states.dtype
        buffer = states.new_empty((*states.shape[:-2], needed + needed // 2, states.shape[-1]), dtype=dtype)
        if held:
            buffer[..., :held, :] = old
        return buffer


def growing(cache):
    """`cache` (a transformers Cache) with each plain `DynamicLayer` made a `GrowingLayer`, in place: the
    same tensors, appended to in place from now on. Other layers (sliding windows, recurrent states) stay."""
    for layer in getattr(cache, "layers", None) or ():
        if type(layer) is DynamicLayer:
            layer.__class__ = GrowingLayer
    return cache


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
        settings = settings_or_defaults(config.rollout.settings, HFRolloutSettings)   # vllm's tests hand it theirs
        self.share_prefix = settings.share_prompts
        """Prefill each distinct prompt once per micro-batch (see the module docstring); False: plain generate."""
        self.keeps_turns = settings.turn_cache
        """Inside turn_cache(), keep each episode's KV cache across turns (see the module docstring)."""
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
        self._kept: dict[int, tuple] | None = None
        """Inside turn_cache(): by episode key, (its tokens the cache holds (n,), [(keys, values) (H, n, D)
        per layer]) from the last generate call."""

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

    @contextmanager
    def turn_cache(self):
        """Keep each episode's KV cache from one generate call to the next (see the module docstring); a model
        that takes no cache, or `[rollout.hf] turn_cache = false`, prefills every turn. Everything kept is freed
        on exit."""
        self._kept = {} if self.keeps_turns and self.cache_keyword is not None else None
        try:
            yield
        finally:
            self._kept = None

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
                bos_token_id=base.bos_token_id, return_dict_in_generate=True, **sampling)   # the ids and the cache
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
                                  bos_token_id=config.bos_token_id, return_dict_in_generate=True)
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

    def _empty_cache(self) -> dict:
        """generate's cache argument for a plain generate: the empty cache generate would make itself (one
        layer per the model's layer types), given so that its full-attention layers grow in place."""
        from transformers import DynamicCache

        return {} if self.cache_keyword is None else {self.cache_keyword: DynamicCache(config=self.module.config)}

    def _kept_cache(self, keys: list[int], ids: torch.Tensor, mask: torch.Tensor) -> dict:
        """generate's cache argument for rows whose episodes have kept caches: the first C columns of the
        left-padded prompts ids / mask (b, W), each row's from the kept keys and values of its prompt's first
        tokens (zeros in its padding), where W - C is the most new tokens of any row (at least one). Uses up
        what it takes from self._kept; {} when no row has a kept cache that C columns could hold."""
        from transformers import DynamicCache

        kept = [self._kept.pop(key, None) for key in keys]
        width, lengths = ids.shape[1], mask.sum(1).tolist()
        covered = []                                    # per row: how many first prompt tokens its cache holds
        for row, entry in enumerate(kept):
            prompt = ids[row, width - lengths[row]:]
            tokens = entry[0][:len(prompt) - 1] if entry is not None else prompt[:0]   # one token is left to feed
            covered.append(int((tokens == prompt[:len(tokens)]).int().cumprod(0).sum()))  # the common prefix
        cached = width - max(n - c for n, c in zip(lengths, covered))
        if cached <= 0:                                 # the widest row has nothing kept
            return {}
        cache = DynamicCache()
        layers = next(entry[1] for entry in kept if entry is not None)
        for layer, (like, _) in enumerate(layers):
            k = like.new_zeros((len(keys), like.shape[0], cached, like.shape[2]))  # (b, H, C, D)
            v = torch.zeros_like(k)
            for row, entry in enumerate(kept):
                n = cached - (width - lengths[row])     # the row's tokens in the cached columns (<= covered)
                if n > 0:
                    k[row, :, cached - n:], v[row, :, cached - n:] = (t[:, :n] for t in entry[1][layer])
            cache.update(k, v, layer)
        return {self.cache_keyword: cache}

    @staticmethod
    def _keep(keys: list[int], mask: torch.Tensor, sequences: torch.Tensor, cache) -> dict:
        """By episode key, each row's tokens that generate's returned `cache` holds (its prompt, left padding
        dropped, and what it sampled but the last token) and views of their keys and values. {} for a cache
        that is not full attention in every layer (sliding windows, recurrent states)."""
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) not in (DynamicLayer, GrowingLayer) for layer in layers):
            return {}
        end = min(cache.get_seq_length(), sequences.shape[1])
        starts = (mask.shape[1] - mask.sum(1)).tolist()                  # each row's left padding
        return {key: (sequences[row, start:end],
                      [(layer.keys[row, :, start:end], layer.values[row, :, start:end]) for layer in layers])
                for row, (key, start) in enumerate(zip(keys, starts))}

    @torch.no_grad()
    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        """One response per row, rows in order; `rollout.micro_batch_size` rows per generate call. Inside
        turn_cache(), with the batch's `episode_key` column, each row continues its episode's kept cache."""
        prompts, prompt_mask = batch["prompts"], batch["prompt_mask"]           # (B, P), left-padded
        keys = batch["episode_key"].tolist() if self._kept is not None and "episode_key" in batch else None
        kept = {}
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
                rows = keys[start:start + micro] if keys is not None else None
                with autocast(self.config.model, self.device):          # model.compute_dtype, as the actor's passes
                    cache = self._kept_cache(rows, ids, mask) if rows is not None else {}
                    cache = cache or self._prefix_cache(ids, mask) or self._empty_cache()  # the first turn
                    out = self.module.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config,
                                               logits_processor=processors,
                                               **{name: growing(c) for name, c in cache.items()})
                if rows is not None:
                    kept.update(self._keep(rows, mask, out.sequences, getattr(out, self.cache_keyword, None)))
                responses.append(out.sequences[:, ids.shape[1]:].cpu())          # (b, R) new tokens: one copy
        finally:
            self.module.train(was_training)
        if keys is not None:
            self._kept = kept                           # the episodes that ended are not in this call: dropped
        width = max(r.shape[1] for r in responses)                               # calls may stop at different R
        pad = self.tokenizer.pad_token_id
        responses = torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=pad) for r in responses])
        return responses_to_batch(responses, eos_token_id=self.eos_token_ids,
                                  pad_token_id=self.tokenizer.pad_token_id, max_new_tokens=params.max_new_tokens)


def make_rollout(config: Config, workers) -> HFRollout:
    return HFRollout(config, workers)
