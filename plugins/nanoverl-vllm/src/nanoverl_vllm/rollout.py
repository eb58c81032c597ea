"""Rollout `vllm`: an offline vLLM engine next to the trainer, fed the actor's weights after every update.

    generate(batch, params)   one vLLM request per row (prompt ids without their left padding), rows
                              in order; responses built by the core's `responses_to_batch`, plus
                              `rollout_log_probs` (vLLM's log-prob of each sampled token)
    sync_weights(actor)       stream the actor's tensors into the running engine (in place, ~0.01 s on
                              the tiny CPU model); if that fails, restart the engine from the actor's
                              current weights instead of generating with a half-loaded model

With a LoRA actor, `[rollout.vllm] lora_sync` picks what a sync sends: "merged" (default) the merged
weights as above; "adapter" the adapter alone: the engine starts once with the frozen base weights and
vLLM's LoRA on (`max_loras = 1`), and each sync writes the adapter to a fresh folder (peft's
save_pretrained layout) and loads it as a new `LoRARequest` (new id; the previous one is removed),
which every generate then passes. A failed adapter load restarts the engine the same way.

Sampling follows `SamplingParams` only (the checkpoint's generation_config.json is ignored). Each
sampled row gets its own vLLM seed, `base + row` with `base` drawn from torch's global generator
(seeded by `trainer.seed`), so a run is reproducible and rows that share a prompt still get different
samples; greedy calls (validation) draw nothing, so validating does not shift the training samples.
Under torchrun the trainer draws those same seeds for the whole step batch (`sample_seed`), so each
rank's engine samples its rows exactly as one process would: a run samples the same tokens on any
number of ranks (up to the engine's float differences between batch shapes).
"""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch

from nanoverl_core import ConfigError, RLBatch, RolloutError, SamplingParams, responses_to_batch
from nanoverl_core.config import Config, settings_or_defaults
from nanoverl_core.dist import is_distributed
from nanoverl_core.rollout import sample_seeds, stop_token_ids

from . import engine
from .engine import TokensPrompt, VLLMSamplingParams
from .settings import VLLMSettings, check_config

log = logging.getLogger("nanoverl_vllm")


def to_vllm_params(params: SamplingParams, *, stop_token_ids: list[int], seed: int | None,
                   log_probs: bool) -> VLLMSamplingParams:
    """nanoverl SamplingParams -> vLLM SamplingParams for one request (n=1: rows are already repeated)."""
    return VLLMSamplingParams(
        n=1,
        temperature=params.temperature,               # 0 is greedy in vLLM too
        top_p=1.0 if params.greedy else params.top_p,
        top_k=0 if params.greedy else params.top_k,   # 0 disables top-k (vLLM < 0.10 spelled it -1)
        max_tokens=params.max_new_tokens,
        stop_token_ids=list(stop_token_ids),          # the stop token is kept in token_ids, as the mask wants
        seed=None if params.greedy else seed,
        logprobs=0 if log_probs else None,            # 0: only the sampled token's log-prob
        detokenize=False)


class VLLMRollout:
    def __init__(self, config: Config, workers, *, log_probs: bool | None = None, sleep: bool | None = None):
        """`sleep=None` frees the engine's accelerator memory between generate calls where vLLM supports
        it (CUDA / ROCm); on CPU there is nothing to free (`sleep=True` there runs the same calls, which
        vLLM's CPU worker ignores: how the tests cover this path). `log_probs` adds `rollout_log_probs`
        (default: [rollout.vllm] log_probs)."""
        self.config = config
        self.tokenizer = workers.tokenizer
        self.actor = workers.actor                                  # re-read after a sleep or a failed sync
        check_config(config)
        settings = settings_or_defaults(config.rollout.settings, VLLMSettings)
        self.adapter_mode = settings.lora_sync == "adapter" and config.model.lora.enable
        if self.adapter_mode and not hasattr(self.actor, "save_adapter"):
            raise ConfigError(f'rollout.vllm.lora_sync = "adapter" needs a LoRA actor with save_adapter / base_tensors '
                              f'(worker.name = hf or fsdp); this {type(self.actor).__name__} has none; set lora_sync = "merged"')
        if self.adapter_mode and self.actor.adapted_embedding:
            raise ConfigError('rollout.vllm.lora_sync = "adapter" cannot serve an adapted embedding (peft lora.Embedding '
                              'in the actor; vLLM\'s LoRA takes linear layers only); drop it from model.lora.target_modules, '
                              'or set lora_sync = "merged"')
        self.lora_request = None                                    # adapter mode: the LoRARequest generate passes
        self._lora_ids = itertools.count(1)
        self.log_probs = self.returns_log_probs = settings.log_probs if log_probs is None else log_probs
        self.sleep = engine.sleep_supported() if sleep is None else sleep
        self.release_kv = (settings.release_kv_cache and not self.sleep and engine.current_platform.is_cpu()
                           and engine.in_process())            # a function cannot reach an engine-core process
        self.deadline = engine.Deadline(settings.timeout_s)        # every generate and weight sync
        self.eos_token_ids = stop_token_ids(self.tokenizer, self.actor.module)
        self.folder = Path(tempfile.mkdtemp(prefix="nanoverl-vllm-"))   # config.json (+ weights on restart)
        weakref.finalize(self, shutil.rmtree, self.folder, True)
        self.hf_config = engine.write_engine_folder(self.actor.module, self.folder)
        self.llm = None
        self.restarts = 0
        self.asleep = self.held = False
        self.last_sync_s = 0.0
        # vLLM creates a torch.distributed group for its world of one unless one exists (torchrun).
        self._owns_distributed = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        self._start(self.actor)

    # ---- engine life cycle -----------------------------------------------------------------------
    def _start(self, actor, *, from_disk: bool = False) -> None:
        """Start an engine holding `actor`'s current weights.

        In-process the engine starts with dummy weights and the real ones are pushed in; with a
        separate engine process (or after a failed push) they are saved to the folder and read from it.
        """
        from_disk = from_disk or not engine.in_process()
        if from_disk:
            engine.save_weights(self._engine_weights(actor), self.folder)
        kwargs = engine.engine_kwargs(self.config, self.folder, self.hf_config,
                                      load_format="safetensors" if from_disk else "dummy", sleep=self.sleep,
                                      lora_rank=actor.lora_rank if self.adapter_mode else None)
        start = time.perf_counter()
        self.llm = engine.start_engine(kwargs)
        self.start_s = time.perf_counter() - start
        self.lora_request = None
        if not from_disk:
            engine.push_weights(self.llm, self._engine_weights(actor), self.folder)
        if self.adapter_mode:
            self._load_adapter(actor)
        self.asleep = False

    def _engine_weights(self, actor):
        """What the engine's own weights are: the frozen base in adapter mode, else the (merged) model."""
        return actor.base_tensors() if self.adapter_mode else actor.full_tensors()

    def _load_adapter(self, actor) -> None:
        """Write the actor's current adapter to a fresh folder and load it as a new LoRARequest (new id),
        dropping the previous one from the engine and from disk."""
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        path = actor.save_adapter(self.folder / f"adapter-{lora_id}")
        request = LoRARequest(f"nanoverl-{lora_id}", lora_id, str(path))
        old, self.lora_request = self.lora_request, None        # never generate with a half-swapped adapter
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter {path}")
        self.lora_request = request

    def restart(self, actor) -> None:
        """Stop the engine and start a fresh one from `actor`'s current weights, written to disk."""
        engine.stop_engine(self.llm, self._owns_distributed)
        self.llm = None
        self._start(actor, from_disk=True)
        self.restarts += 1

    def close(self) -> None:
        engine.stop_engine(self.llm, self._owns_distributed)
        self.llm = None
        shutil.rmtree(self.folder, ignore_errors=True)

    # ---- weights ---------------------------------------------------------------------------------
    def sync_weights(self, actor, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Make the next generate use the actor's current weights.

        `weights` (name, tensor) pairs default to the actor's full state dict, streamed one tensor at a
        time. A failure part-way would leave the engine with some layers new, some old and some not
        loaded at all, so the engine is restarted from the actor's weights instead (and the error logged).
        In adapter mode (`lora_sync = "adapter"`) `weights` is not used: the actor's adapter is loaded.
        """
        start = time.perf_counter()
        self.actor = actor
        stream = None if self.adapter_mode else iter(weights if weights is not None else actor.full_tensors())
        failed = False
        try:
            engine.ensure_alive(self.llm)
            with self.deadline(self.llm, "a weight sync"):
                if self.adapter_mode:                         # the base stays; only the adapter is swapped
                    if self.asleep:
                        self.llm.wake_up()                    # level-1 sleep kept the base weights in host memory
                        self.asleep = False
                    self._load_adapter(actor)
                else:
                    if self.asleep:
                        self.llm.wake_up(tags=["weights"])    # allocate the weight memory back (contents are stale)
                    engine.push_weights(self.llm, stream, self.folder)
                    if self.asleep:
                        self.llm.wake_up(tags=["kv_cache"])
                        self.asleep = False
        except Exception as exc:
            log.warning("vLLM weight sync failed (%s: %s); restarting the engine from the actor's current weights",
                        type(exc).__name__, exc)
            failed = True
            _drain(stream or ())                              # the other ranks' gathers go on to the last tensor
        self._recover(actor, failed)
        self.last_sync_s = time.perf_counter() - start

    def _recover(self, actor, failed: bool) -> None:
        """Restart this rank's engine from the actor's current weights if `failed`.

        Under torchrun (an FSDP actor) those weights are gathered from every rank's shards, so the
        ranks first agree whether any engine failed, and those whose engine is fine take part in the
        same gathers (and drop what they yield). One process: a plain restart."""
        if not _any_rank(failed):
            return
        if failed:
            self.restart(actor)
            return
        _drain(self._engine_weights(actor))
        if self.adapter_mode:
            shutil.rmtree(actor.save_adapter(self.folder / "adapter-recovery"), ignore_errors=True)

    def _generate(self, requests, sampling):
        """llm.generate, and once more after restarting the engine from the actor's weights if it failed
        (a separate engine-core process that died or stopped answering within the deadline, say); a
        second failure stops the run."""
        def attempt():
            try:
                engine.ensure_alive(self.llm)
                with engine.own_rng(), self.deadline(self.llm, "a generate call"):   # every request has its seed
                    return self.llm.generate(requests, sampling, use_tqdm=False,        # same order as requests
                                             lora_request=self.lora_request), None
            except Exception as exc:
                log.warning("vLLM generate failed (%s: %s)", type(exc).__name__, exc)
                return None, exc

        outputs, error = attempt()
        self._recover(self.actor, error is not None)          # every rank calls it: under torchrun a collective
        if error is not None:
            outputs, error = attempt()
        if error is not None:
            raise RolloutError(f"the vLLM engine failed again after a restart ({type(error).__name__}: {error}); "
                               "the run stops here, its newest checkpoint is intact: rerun the same command to "
                               "resume") from error
        return outputs

    def _sleep(self) -> None:
        """Free weights + KV cache while the trainer works; adapter mode keeps the base in host memory (level 1)."""
        self.llm.sleep(level=1 if self.adapter_mode else 2)
        self.asleep = True

    def _rest(self) -> None:
        """After a batch: sleep where vLLM can; on CPU free the KV cache's pages ([rollout.vllm] release_kv_cache)."""
        if self.sleep:
            self._sleep()
        elif self.release_kv:
            engine.release_kv_cache(self.llm)

    @contextmanager
    def awake(self):
        """Keep the engine awake across the generate calls of one batch of multi-turn episodes (each turn
        is a call): it sleeps once at the end, and the turns reuse its prefix cache instead of waking it,
        weights and all, for every turn."""
        self.held = True
        try:
            yield
        finally:
            self.held = False
            if not self.asleep and self.llm is not None:
                self._rest()

    @staticmethod
    def _seeds(batch: RLBatch, params: SamplingParams) -> list[int]:
        """One vLLM seed per row: `base + row`, base drawn from torch's global generator (greedy draws
        none); under torchrun the trainer's `sample_seed` column, the same numbers for the whole batch."""
        if params.greedy:
            return [0] * len(batch)
        if "sample_seed" in batch:
            return batch["sample_seed"].tolist()
        return sample_seeds(len(batch)).tolist()

    # ---- generation --------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, batch: RLBatch, params: SamplingParams) -> RLBatch:
        """One response per row of `batch`, in row order (see nanoverl_core.rollout)."""
        if self.asleep:                                        # slept since the last sync: weights were dropped
            self.sync_weights(self.actor)
        prompts, prompt_mask = batch["prompts"], batch["prompt_mask"].bool()            # (B, P), left-padded
        requests = [TokensPrompt(prompt_token_ids=row[mask].tolist()) for row, mask in zip(prompts, prompt_mask)]
        sampling = [to_vllm_params(params, stop_token_ids=self.eos_token_ids, seed=seed, log_probs=self.log_probs)
                    for seed in self._seeds(batch, params)]
        outputs = self._generate(requests, sampling)
        completions = [out.outputs[0] for out in outputs]
        responses = [list(c.token_ids) for c in completions]
        log_probs = None
        if self.log_probs:
            log_probs = [[step[token].logprob for token, step in zip(c.token_ids, c.logprobs)] for c in completions]
        if not self.held:
            self._rest()
        return responses_to_batch(responses, eos_token_id=self.eos_token_ids, pad_token_id=self.tokenizer.pad_token_id,
                                  max_new_tokens=params.max_new_tokens, log_probs=log_probs)


def _drain(tensors: Iterable) -> None:
    """Consume what is left of a weight stream: under torchrun each tensor is a gather every rank joins."""
    for _ in tensors:
        pass


def _any_rank(flag: bool) -> bool:
    """`flag` on any rank (an all-reduce under torchrun; the flag itself in one process, where the only
    process group may be vLLM's own: is_distributed looks at WORLD_SIZE)."""
    if not is_distributed():
        return flag
    value = torch.tensor(float(flag))
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value)


def make_rollout(config: Config, workers) -> VLLMRollout:
    return VLLMRollout(config, workers)


make_rollout.check_config = check_config           # [rollout.vllm] lora_sync checks, run before any model loads
