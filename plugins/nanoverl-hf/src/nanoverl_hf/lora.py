"""LoRA for the `hf` and `fsdp` workers, through peft (`pip install "nanoverl-hf[lora]"`).

With `[model.lora] enable = true` the policy (and the value model, whose `score` head stays
trainable in full) is wrapped with `peft.get_peft_model`: the base weights are frozen, and only the
adapter (and the value head) require grad. `LoraWeights` is the core's `weights` strategy for such a
module: `TorchActor(module, config, weights=LoraWeights())` (and `parallel=FSDPParallel(...)` for the
sharded `fsdp` worker: the two strategies combine). It says:

- What trains: the parameters that require grad, so the optimizer holds Adam state for the adapter alone.
- Reference: `LoraWeights.reference(actor)`, a frozen actor over `AdapterDisabled`, a view of the
  actor's own module run inside peft's `disable_adapter()`; it holds no parameter, so there is no
  second copy of the model. A disabled LoRA layer computes exactly `base_layer(x)`, so reference
  log-probs equal the base model's bit for bit (a test pins it).
- Checkpoints: in one process `adapter_model.safetensors` (peft's `get_peft_model_state_dict`, the
  file peft's own `save_pretrained` writes) and `adapter_config.json`; sharded, each rank's shards of
  the trainable entries and `adapter_config.json`. The optimizer state is the parallel strategy's as
  for any worker; the frozen base is rebuilt from `model.path` (and `trainer.seed` for random weights).
- Rollout weights: `merged_tensors` yields the merged model's state dict under plain transformers
  names, each LoRA layer's weight computed as W + scale * B @ A on the fly. W itself is never
  changed, so repeated syncs cannot drift (an in-place merge_adapter / unmerge_adapter round trip
  is not exact in floating point: W + d - d != W). Sharded (DTensor) entries are gathered first.
  For an engine that serves the adapter itself (vLLM's `[rollout.vllm] lora_sync = "adapter"`),
  `base_tensors` yields the frozen W under the same names and `save_adapter` writes a peft
  save_pretrained folder.
- Export: peft's `merge_and_unload` gives the plain model that `save_pretrained` writes.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from nanoverl_core import ConfigError, TorchActor
from nanoverl_core.config import Config
from nanoverl_core.errors import CheckpointMismatch
from nanoverl_core.plugins import install_hint

INSTALL = install_hint("lora")
"""pip's command for peft: from the index, and from a source checkout its editable form."""
ADAPTER_FILE = "adapter_model.safetensors"
"""The adapter's weights in a checkpoint's actor/ (and critic/) folder, as peft's save_pretrained names them."""
VALUE_HEAD = "score"
"""The value model's head (AutoModelForTokenClassification), trained in full next to its adapter."""


def require_peft():
    """The peft module, or a ConfigError with the install line (checked before any model loads)."""
    try:
        import peft
    except ImportError:
        raise ConfigError(f"model.lora.enable = true needs peft, which is not installed: {INSTALL} "
                          "(or set model.lora.enable = false)") from None
    return peft


def _adaptable_modules(model: torch.nn.Module) -> list[str]:
    """Full names of the layers LoRA can adapt: linear layers (transformers' Conv1D too), not the output
    head, and the input embedding (peft's lora.Embedding; a tied output head follows it)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = []
    for name, module in model.named_modules():
        if module is output or name.split(".")[-1] == VALUE_HEAD:
            continue
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or type(module).__name__ == "Conv1D":
            names.append(name)
    return names


def check_target_modules(model: torch.nn.Module, config: Config):
    """model.lora.target_modules as peft takes it; a name matching no adaptable layer is a ConfigError
    listing the names that exist (a name matches a layer whose full name is it or ends in ".name")."""
    targets = config.model.lora.target_modules
    names = _adaptable_modules(model)
    if targets == "all-linear":
        return targets
    for target in targets:
        if not any(name == target or name.endswith("." + target) for name in names):
            valid = sorted({name.split(".")[-1] for name in names})
            raise ConfigError(f"model.lora.target_modules: {target!r} matches no linear or embedding layer of this "
                              f"model; valid choices: all-linear, {', '.join(valid)}")
        embedding = any(isinstance(module, torch.nn.Embedding) and (name == target or name.endswith("." + target))
                        for name, module in model.named_modules())
        if embedding and config.worker.name != "hf":     # a tied head's adapter is a view of the embedding's
            raise ConfigError(f"model.lora.target_modules: {target!r} is an embedding layer, adapted with "
                              f"worker.name = \"hf\" only (not {config.worker.name!r}); drop it from the list")
    return list(targets)


def apply_lora(model: torch.nn.Module, config: Config, *, value_model: bool = False):
    """`model` wrapped by peft.get_peft_model with the [model.lora] settings: base frozen, adapter trainable
    (plus the value head in full for a value model). The adapter's random init is drawn from
    trainer.seed (+3 for the value model) without touching the global RNG stream."""
    peft = require_peft()
    cfg = config.model.lora
    targets = check_target_modules(model, config)
    embedding = targets != "all-linear" and any(
        isinstance(module, torch.nn.Embedding) and any(name == t or name.endswith("." + t) for t in targets)
        for name, module in model.named_modules())
    lora_config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                  target_modules=targets, bias="none",
                                  modules_to_save=[VALUE_HEAD] if value_model else None,
                                  ensure_weight_tying=embedding,   # a tied output head shares the embedding's adapter
                                  task_type=None if value_model else "CAUSAL_LM")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")   # peft asks transformers 5
        warnings.filterwarnings("ignore", message=".*tied_target_modules.*")  # handled: merged_tensors, ensure_weight_tying
        torch.manual_seed(config.trainer.seed + (3 if value_model else 2))
        wrapped = peft.get_peft_model(model, lora_config)
    return wrapped


class AdapterDisabled(torch.nn.Module):
    """The LoRA reference policy: the actor's module, run with its adapter disabled.

    The peft model is held as a plain attribute, not a submodule, so this view has no parameters or
    state dict of its own: freezing it (as the core does for a reference) cannot touch the adapter,
    and nothing is copied."""

    def __init__(self, peft_model: torch.nn.Module):
        super().__init__()
        object.__setattr__(self, "peft_model", peft_model)

    @property
    def config(self):
        return self.peft_model.get_base_model().config

    def get_output_embeddings(self):
        """The peft model's head: the core's chunked log-probs hook it, inside this forward (adapter disabled)."""
        return self.peft_model.get_output_embeddings()

    def get_base_model(self):
        """The transformers model under the adapter: the core reads its forward's keywords (logits_to_keep, cache)."""
        return self.peft_model.get_base_model()

    def forward(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def merged_tensors(peft_model: torch.nn.Module, *, merge: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the merged model's state dict, plain transformers names, one at a time.

    Each adapted weight is W + scale * B @ A (transposed for fan_in_fan_out layers), computed in
    float32 and cast to W's dtype; W is not modified. `merge=False` yields the frozen base weights W
    themselves under the same names (what an engine serving the adapter separately starts from).
    Under torchrun every DTensor is gathered (a collective): consume the iterator whole on every rank."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, value in base.state_dict().items():
        if ".lora_" in name:
            continue
        tensor = _full(value).detach()
        prefix, sep, leaf = name.rpartition(".base_layer.")
        if sep:
            layer, name = layers[prefix], f"{prefix}.{leaf}"
            if leaf == "weight" and merge:
                delta = torch.zeros(tensor.shape, dtype=torch.float32, device=tensor.device)
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_embedding_A:        # lora.Embedding: (B @ A).T, as peft's get_delta_weight
                        lora_a = _full(layer.lora_embedding_A[adapter]).detach().float()
                        lora_b = _full(layer.lora_embedding_B[adapter]).detach().float()
                        delta += (lora_b @ lora_a).T * layer.scaling[adapter]
                        continue
                    lora_a = _full(layer.lora_A[adapter].weight).detach().float()
                    lora_b = _full(layer.lora_B[adapter].weight).detach().float()
                    step = (lora_b @ lora_a) * layer.scaling[adapter]
                    delta += step.T if layer.fan_in_fan_out else step
                tensor = (tensor.float() + delta).to(tensor.dtype)
        yield name, tensor


def save_adapter(peft_model: torch.nn.Module, folder: Path) -> Path:
    """Write the current adapter as peft's save_pretrained does (adapter_model.safetensors, peft's
    get_peft_model_state_dict names, + adapter_config.json), loadable by peft and by vLLM's LoRARequest.
    Sharded (DTensor) entries are gathered: call it on every rank under torchrun."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    # save_embedding_layers=False: with an adapted embedding peft would also save the frozen base
    # embedding (and a tied head sharing its storage, which safetensors refuses); it is rebuilt anyway
    state = {k: _full(v).detach().to("cpu").contiguous()
             for k, v in get_peft_model_state_dict(peft_model, save_embedding_layers=False).items()}
    save_file(state, str(folder / ADAPTER_FILE))
    save_adapter_config(peft_model, folder)
    return folder


def save_adapter_config(peft_model: torch.nn.Module, folder: Path) -> None:
    """adapter_config.json, as peft's save_pretrained writes it."""
    peft_model.peft_config["default"].save_pretrained(str(folder))


def has_adapted_embedding(peft_model: torch.nn.Module) -> bool:
    """Whether any adapter sits on an embedding layer (peft's lora.Embedding)."""
    from peft.tuners.lora import Embedding

    return any(isinstance(module, Embedding) for module in peft_model.modules())


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module):
    """Adapter dropout off for a log-prob / value pass (the update's forward keeps it)."""
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


def load_adapter(peft_model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights (get_peft_model_state_dict names) into `peft_model`; every trainable
    tensor must be in `state` and every entry of `state` must fit (else CheckpointMismatch)."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state)
    trainable = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    missing = sorted(trainable & set(result.missing_keys))
    if result.unexpected_keys or missing:
        raise CheckpointMismatch(f"the adapter does not fit this model: missing {missing[:3]}, unexpected "
                                 f"{sorted(result.unexpected_keys)[:3]}; resume with the run's model.lora settings")


class LoraWeights:
    """The core's `weights` strategy for a peft module: what trains is the adapter (and a value model's
    `score` head), checkpoints hold that alone, and rollouts load the merged model."""

    lora = True

    def parameters(self, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The adapter (and the value head): peft froze everything else."""
        return [p for p in module.parameters() if p.requires_grad]

    def inference(self, module: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Adapter dropout off in log-prob and value passes (the update's forward keeps it)."""
        return eval_mode(module)

    def full_tensors(self, module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The merged weights under the base model's names (what a rollout engine loads)."""
        return merged_tensors(module)

    def checkpoint_entries(self, module: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        """The trainable entries only (a sharded state dict without frozen parameters still holds a
        tied lm_head, which is not a parameter name)."""
        trainable = {name for name, p in module.named_parameters() if p.requires_grad}
        return {name: value for name, value in state.items() if name in trainable}

    def save_config(self, module: torch.nn.Module, folder: Path) -> None:
        save_adapter_config(module, folder)

    def save(self, module: torch.nn.Module, folder: Path) -> None:
        """ADAPTER_FILE and adapter_config.json, as peft's save_pretrained writes them."""
        save_adapter(module, folder)

    def load(self, module: torch.nn.Module, folder: Path, device: torch.device) -> None:
        from safetensors.torch import load_file

        if not (folder / ADAPTER_FILE).is_file():
            raise CheckpointMismatch(f"{folder} holds no LoRA adapter ({ADAPTER_FILE}): it was saved by a run without "
                                     "model.lora.enable; resume it with the same model.lora settings")
        load_adapter(module, load_file(str(folder / ADAPTER_FILE), device=str(device)))

    def actor_attributes(self, module: torch.nn.Module) -> dict[str, Any]:
        """What lets nanoverl-vllm serve the adapter itself (`lora_sync = "adapter"`): `save_adapter(folder)`,
        `base_tensors()` (the frozen base under the base model's names), `lora_rank`, `adapted_embedding`."""
        return {"save_adapter": functools.partial(save_adapter, module),
                "base_tensors": functools.partial(merged_tensors, module, merge=False),
                "lora_rank": module.peft_config["default"].r,
                "adapted_embedding": has_adapted_embedding(module)}

    def reference(self, actor: TorchActor) -> TorchActor:
        """The reference policy: a frozen actor over AdapterDisabled(actor.module), on the actor's ranks
        (`parallel`), with full weights (it has none of its own: nothing to save or train)."""
        return TorchActor(AdapterDisabled(actor.module), actor.config, trainable=False, device=actor.device,
                          parallel=actor.parallel)
