"""Policy / reference / value workers: the public names backends build on.

A worker plugin registers ``make_workers(config) -> Workers``. Its job is to build torch modules and a
tokenizer; the PPO mechanics live once in ``TorchActor`` and ``TorchCritic`` (workers/ppo.py), so
every backend updates the same way. What differs between backends is handed to a worker as two
strategies: ``parallel`` (``SingleProcess`` here, FSDP in nanoverl-fsdp) and ``weights``
(``FullWeights`` here, a LoRA adapter in nanoverl-hf). The package:

    ppo.py           TorchActor, TorchCritic, Workers: passes, mini-batches, the losses, optimizer steps
    forward.py       ForwardPass: how a micro-batch reaches the model (layout, prompts, head, precision)
    strategies.py    the DataParallel and Weights protocols, SingleProcess and FullWeights
    rows.py          a batch's rows as module inputs, micro-batches under a token budget
    packing.py       padding-free micro-batches: rows end to end, attention kept inside each row
    prompt_cache.py  each distinct prompt through the model once (training passes, the hf rollout)
    lm_head.py       log-probs through the LM head a chunk of positions at a time
    precision.py     model.compute_dtype: autocast, what "auto" picks, float32 attention in backward
    compile.py       model.compile: torch.compile over the blocks' cache-free parts, its metrics
    checkpoint.py    a worker's checkpoint files: their names, and how tensors are written and read
"""

from .checkpoint import (MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, checkpoint_fits, load_optimizer, load_scheduler,
                         load_tensors, save_optimizer, save_scheduler, save_tensors)
from .compile import compile_blocks, compile_metrics
from .forward import ForwardPass
from .lm_head import ChunkedHead
from .ppo import NonFiniteError, TorchActor, TorchCritic, Workers, build_scheduler, mean_metrics, resolve_device
from .precision import autocast
from .prompt_cache import cache_keyword, checkpointed, forward_keyword, prompt_cache
from .rows import model_inputs, token_budget_groups
from .strategies import DataParallel, FullWeights, SingleProcess, Weights

__all__ = ["MODEL_FILE", "OPTIMIZER_FILE", "SCHEDULER_FILE", "checkpoint_fits", "load_optimizer", "load_scheduler",
           "load_tensors", "save_optimizer", "save_scheduler", "save_tensors", "ChunkedHead", "ForwardPass",
           "NonFiniteError",
           "TorchActor", "TorchCritic", "Workers", "autocast", "build_scheduler", "mean_metrics", "model_inputs",
           "resolve_device", "token_budget_groups", "compile_blocks", "compile_metrics", "cache_keyword",
           "checkpointed", "forward_keyword", "prompt_cache",
           "DataParallel", "FullWeights", "SingleProcess", "Weights"]
