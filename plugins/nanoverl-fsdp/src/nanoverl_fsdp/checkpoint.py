"""The fsdp worker's sharded checkpoint format, in one place: what every rank writes and reads back,
and the file names `export.py` reads.

A worker's folder (`checkpoints/step_<N>/actor/`, `critic/`) holds, for N ranks:

    model_rank<r>.safetensors  rank r's shard of every entry the checkpoint holds (`DTensor.to_local()`):
                               the whole state dict, or with LoRA weights the trainable entries only
    optimizer_rank<r>.pt       rank r's optimizer state (its shards, numbers, strings), weights-only torch.save
    shards.json                rank 0: world size, each entry's full shape and sharded dim, and "lora"
    adapter_config.json        rank 0, LoRA weights only: as peft writes it
    scheduler.json             rank 0: the learning-rate schedule (the core's file, nanoverl_core.workers)
    hf/                        rank 0, the policy only: transformers config, generation config, tokenizer

Nothing is pickled. Each rank saves its own shards and loads them back into the same DTensors, so a
checkpoint resumes on the same number of ranks only; `export.py` joins the shards into one model.
The state dicts come from torch.distributed.checkpoint's state_dict API; its own file format (DCP)
is not used because it keeps its metadata as a pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.tensor import DTensor

from nanoverl_core.dist import rank, world_size
from nanoverl_core.errors import CheckpointMismatch
from nanoverl_core.workers import (Weights, checkpoint_fits, load_scheduler, load_tensors, save_scheduler,
                                   save_tensors)

MODEL_FILE = "model_rank{rank}.safetensors"
"""Each rank's shards of the model."""
OPTIMIZER_FILE = "optimizer_rank{rank}.pt"
"""Each rank's optimizer state (its shards, numbers, strings), next to MODEL_FILE and (rank 0) SHARDS."""
SHARDS = "shards.json"
"""Written by rank 0: {"world_size": N, "model": {name: {"shape": [...], "shard_dim": int or null}}, "lora": bool}."""
HF_FILES = "hf"
"""Sub-folder of a saved actor holding config.json, generation_config.json and the tokenizer."""


def save_shards(path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
         weights: Weights) -> None:
    """Called on every rank with the same path. The trainer's barrier after the save makes the folder
    complete before rank 0 renames it."""
    path.mkdir(parents=True, exist_ok=True)
    model, optim = _state_dicts(module, optimizer, weights)
    me = rank()
    save_file(_local(model), str(path / MODEL_FILE.format(rank=me)))
    if optim is not None:                                   # plain tensors, numbers, strings: weights_only loads it
        save_tensors(_local(optim), path / OPTIMIZER_FILE.format(rank=me))
    if me == 0:
        layout = {name: {"shape": list(value.shape), "shard_dim": _shard_dim(value)} for name, value in model.items()}
        (path / SHARDS).write_text(json.dumps({"world_size": world_size(), "model": layout, "lora": weights.lora}))
        weights.save_config(module, path)
        if scheduler is not None:
            save_scheduler(path, scheduler)


def save_hf_files(path: Path, module: torch.nn.Module, tokenizer) -> None:
    """Rank 0: what export needs to rebuild a plain model (config, generation config, tokenizer)."""
    if rank() == 0:
        module.config.save_pretrained(path / HF_FILES)
        module.generation_config.save_pretrained(path / HF_FILES)
        tokenizer.save_pretrained(path / HF_FILES)


@torch.no_grad()
def load_shards(path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler,
         weights: Weights) -> None:
    """What `save_shards` wrote, on the same number of ranks, each rank its own files."""
    world, me = world_size(), rank()
    saved_world = json.loads((path / SHARDS).read_text())["world_size"]
    if saved_world != world:
        raise CheckpointMismatch(f"{path} was saved by {saved_world} ranks; "
                                 f"resume it on {saved_world} ranks, not {world}")
    model, optim = _state_dicts(module, optimizer, weights)
    options = _options(weights, load=True)
    with checkpoint_fits(path):
        model = _fill(model, load_file(str(path / MODEL_FILE.format(rank=me))), "model")
        if optimizer is None:
            set_model_state_dict(module, model, options=options)
        else:
            saved = load_tensors(path / OPTIMIZER_FILE.format(rank=me))
            set_state_dict(module, optimizer, model_state_dict=model, optim_state_dict=_fill(optim, saved, "optimizer"),
                           options=options)
        if scheduler is not None:
            load_scheduler(path, scheduler)


def _options(weights: Weights, load: bool = False) -> StateDictOptions:
    """LoRA weights save and load what trains (adapter, value head), not the frozen base."""
    return StateDictOptions(ignore_frozen_params=weights.lora, strict=not (load and weights.lora))


def _state_dicts(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, weights: Weights):
    """(the module's entries the checkpoint holds, the optimizer's state dict or None), sharded (DTensors)."""
    if optimizer is None:
        return weights.checkpoint_entries(module, get_model_state_dict(module, options=_options(weights))), None
    model, optim = get_state_dict(module, optimizer, options=_options(weights))   # creates Adam's state if still empty
    return weights.checkpoint_entries(module, model), optim


def _local(tree):
    """`tree` (nested dicts / lists) with every tensor replaced by a CPU copy of this rank's shard."""
    if isinstance(tree, dict):
        return {k: _local(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_local(v) for v in tree)
    if isinstance(tree, torch.Tensor):
        return (tree.to_local() if isinstance(tree, DTensor) else tree).detach().to("cpu", copy=True)
    return tree


def _fill(into, saved, where: str = ""):
    """Copy `saved` (as _local wrote it) into the same-shaped tree `into`: tensors in place (a DTensor
    into its local shard), other values (learning rates, betas, ...) replaced. Returns the filled tree."""
    if isinstance(into, dict):
        if not isinstance(saved, dict) or into.keys() != saved.keys():
            raise CheckpointMismatch(f"checkpoint entry {where or '/'} does not match the model or optimizer")
        return {k: _fill(into[k], saved[k], f"{where}/{k}") for k in into}
    if isinstance(into, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(into) != len(saved):
            raise CheckpointMismatch(f"checkpoint entry {where} does not match the model or optimizer")
        return type(into)(_fill(a, b, f"{where}/{i}") for i, (a, b) in enumerate(zip(into, saved)))
    if isinstance(into, torch.Tensor):
        local = into.to_local() if isinstance(into, DTensor) else into
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape:
            raise CheckpointMismatch(f"checkpoint entry {where}: shape {getattr(saved, 'shape', None)}, "
                                     f"this rank's shard is {tuple(local.shape)}")
        local.copy_(saved)
        return into
    return saved


def _shard_dim(value: torch.Tensor) -> int | None:
    """The dim an entry is split along over the ranks (in rank order); None if every rank holds it whole."""
    shards = [p.dim for p in value.placements if p.is_shard()] if isinstance(value, DTensor) else []
    return shards[0] if shards else None
