"""Loading transformers models and tokenizers from what `[model]` names.

`model.path` may be
  - a model folder with weights (`*.safetensors` / `pytorch_model*.bin`): loaded with `from_pretrained`;
  - a folder with `config.json` (and tokenizer files) but no weights: the model is built with
    `from_config` and random weights drawn from `trainer.seed` (how tiny from-scratch models are made);
  - a `.gguf` file: its config, tokenizer and de-quantized weights are read with transformers' GGUF
    reader (needs the `gguf` package) into an ordinary float model, so it trains and saves like any other.

The tokenizer comes from `model.tokenizer_path` or the model's folder (or the GGUF file). A tokenizer
without a pad token pads with EOS.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from pathlib import Path
from typing import Any

import attrs
import torch

from nanoverl_core import ConfigError
from nanoverl_core.config import Config, ModelConfig
from nanoverl_core.rollout import stop_token_ids

log = logging.getLogger("nanoverl_hf")

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@attrs.frozen
class ModelSource:
    """Where a model comes from, resolved from `model.path`."""
    folder: Path
    gguf_file: str | None = None
    """File name inside `folder` when the model is a GGUF file."""
    has_weights: bool = True
    """False: a config-only folder; weights are drawn at random from the seed."""

    @property
    def kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_source(cfg: ModelConfig) -> ModelSource:
    """Check `model.path` and say what it is; every user mistake is a ConfigError naming the key."""
    if not cfg.path:
        raise ConfigError("model.path is empty; set it to a local Hugging Face model folder or a .gguf file")
    path = Path(cfg.path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"model.path = {cfg.path!r} does not exist; download the GGUF file first "
                              "(see the nanoverl-hf README) or fix the path")
        if importlib.util.find_spec("gguf") is None:
            raise ConfigError(f"model.path = {cfg.path!r} is a GGUF file, which needs the gguf package: "
                              "pip install gguf (or nanoverl-hf[gguf])")
        return ModelSource(path.parent, gguf_file=path.name)
    if not path.exists():
        raise ConfigError(f"model.path = {cfg.path!r} does not exist; point it at a local model folder "
                          "(config.json + tokenizer files, with or without weights) or a .gguf file")
    # a file that is not a .gguf, or a folder without config.json: refused at config load (model.path's kind)
    has_weights = any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS)
    return ModelSource(path, has_weights=has_weights)


def check_model_source(config: Config) -> None:
    """`make_workers.check_config` of the workers built from these models (hf, fsdp): `model.path` (and the
    gguf package for a .gguf file) checked before the run directory is written or a model loads; a teacher
    model's tokenizer against the student's."""
    source = resolve_source(config.model)
    if config.teacher.adapter:
        from .lora import require_peft
        require_peft()
    elif config.teacher.enable and not config.teacher.from_checkpoint:
        check_teacher_tokenizer(config, source)


def teacher_config(config: Config) -> tuple[Config, ModelSource]:
    """The config whose [model] is the teacher model teacher.path names, and where that model comes from."""
    model = attrs.evolve(config.model, path=config.teacher.path, tokenizer_path="")
    try:
        source = resolve_source(model)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.path", "teacher.path")) from None
    if not source.has_weights:
        raise ConfigError(f"teacher.path = {config.teacher.path!r} holds a config but no weights; a teacher is a "
                          "trained model: name a folder with its weights, a .gguf file or a nanoverl checkpoint")
    return attrs.evolve(config, model=model), source


def check_teacher_tokenizer(config: Config, student: ModelSource) -> None:
    """The teacher scores the student's token ids, so both must read text into the same ids."""
    teacher_cfg, source = teacher_config(config)
    try:
        theirs = load_tokenizer(teacher_cfg.model, source)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.path", "teacher.path")) from None
    ours = load_tokenizer(config.model, student)
    differ = {k for k, v in theirs.get_vocab().items() if ours.get_vocab().get(k) != v}
    if differ or len(theirs) != len(ours) or theirs.eos_token_id != ours.eos_token_id:
        detail = (f"{len(differ)} tokens map to other ids, e.g. {sorted(differ)[:3]}" if differ
                  else f"{len(theirs)} tokens against the student's {len(ours)}" if len(theirs) != len(ours)
                  else f"EOS id {theirs.eos_token_id} against the student's {ours.eos_token_id}")
        raise ConfigError(f"teacher.path = {config.teacher.path!r} has another tokenizer than the student's ({detail}); "
                          "distillation compares the two models' log-probs of the same token ids: use a teacher "
                          "with the student's tokenizer")


def build_teacher(config: Config, policy):
    """The frozen teacher, on the CPU: the model teacher.path names, a LoRA adapter merged into a copy of the
    student's model, or for a checkpoint a copy of the student's architecture (the trainer loads the checkpoint's
    policy into it); None without [teacher]."""
    if not config.teacher.enable:
        return None
    if config.teacher.from_checkpoint:
        teacher = copy.deepcopy(policy)
    elif config.teacher.adapter:                        # a LoRA adapter of the student's model: merged into a copy
        from peft import PeftModel
        teacher = PeftModel.from_pretrained(copy.deepcopy(policy), config.teacher.path).merge_and_unload()
    else:
        teacher = load_policy(*teacher_config(config))
    return teacher.eval().requires_grad_(False)


def load_tokenizer(cfg: ModelConfig, source: ModelSource):
    from transformers import AutoTokenizer

    if cfg.tokenizer_path:
        if not Path(cfg.tokenizer_path).is_dir():
            raise ConfigError(f"model.tokenizer_path = {cfg.tokenizer_path!r} is not a folder; fix the path "
                              "or leave it empty to use the model's tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path, trust_remote_code=cfg.trust_remote_code)
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(source.folder, trust_remote_code=cfg.trust_remote_code,
                                                      **source.kwargs)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.path = {cfg.path!r}: no usable tokenizer ({exc}); add tokenizer files "
                              "to the folder or set model.tokenizer_path") from None
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer of {cfg.tokenizer_path or cfg.path!r} has no EOS token; "
                          "generation could never stop (set eos_token in tokenizer_config.json)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        log.warning("the tokenizer has no pad token; padding with EOS (%r)", tokenizer.eos_token)
    tokenizer.padding_side = "left"  # prompts are left-padded so generation continues every row at the end
    return tokenizer


def _from_config(auto_cls, hf_config, dtype: torch.dtype, seed: int, cfg: ModelConfig):
    """A model with random weights drawn from `seed`, without touching the global RNG stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return auto_cls.from_config(hf_config, dtype=dtype, trust_remote_code=cfg.trust_remote_code)


def _load_gguf(auto_cls, source: ModelSource, dtype: torch.dtype, cfg: ModelConfig):
    """De-quantize a GGUF file into a plain float model (trainable and savable, unlike a quantized load)."""
    from unittest import mock

    from transformers import AutoConfig
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    hf_config = AutoConfig.from_pretrained(source.folder, gguf_file=source.gguf_file)
    model = _from_config(auto_cls, hf_config, dtype, 0, cfg)
    with mock.patch.object(gguf_utils, "tqdm", lambda items, **_: items):  # a progress bar per tensor floods logs
        tensors = gguf_utils.load_gguf_checkpoint(str(source.folder / source.gguf_file), return_tensors=True,
                                                  model_to_load=model, torch_dtype=dtype)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if hf_config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - tied
    if missing:
        raise ConfigError(f"model.path = {cfg.path!r}: the GGUF file lacks weights for {sorted(missing)[:5]}; "
                          "this architecture is not supported from GGUF, use a safetensors model folder")
    model.tie_weights()
    return model


def load_policy(config: Config, source: ModelSource):
    """The causal LM named by `model.path`, in `model.dtype`, on the CPU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = config.model
    dtype = DTYPES[cfg.dtype]
    if source.gguf_file:
        model = _load_gguf(AutoModelForCausalLM, source, dtype, cfg)
    elif source.has_weights:
        model = AutoModelForCausalLM.from_pretrained(source.folder, dtype=dtype,
                                                     trust_remote_code=cfg.trust_remote_code)
    else:
        hf_config = AutoConfig.from_pretrained(source.folder, trust_remote_code=cfg.trust_remote_code)
        model = _from_config(AutoModelForCausalLM, hf_config, dtype, config.trainer.seed, cfg)
        log.info("model.path %s has no weights: random init from trainer.seed=%d", cfg.path, config.trainer.seed)
    # Training forwards need no KV cache; generate() asks for one explicitly.
    model.config.use_cache = False
    return disable_dropout(model)


def disable_dropout(model):
    """Dropout off everywhere: old, new and reference log-probs of one sequence must agree exactly."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


def build_value_model(policy, config: Config):
    """A value model on the policy's backbone: `AutoModelForTokenClassification` with one label, so
    `.logits` is (B, T, 1). The backbone starts as a copy of the policy's (as in verl); the scalar head
    (`score`) is drawn from `trainer.seed + 1`. Dropout is off, so values agree in train and eval mode."""
    from transformers import AutoModelForTokenClassification

    hf_config = copy.deepcopy(policy.config)
    hf_config.num_labels = 1
    hf_config.classifier_dropout = 0.0
    hf_config.id2label, hf_config.label2id = {0: "value"}, {"value": 0}
    critic = _from_config(AutoModelForTokenClassification, hf_config, policy.dtype, config.trainer.seed + 1,
                          config.model)
    critic.base_model.load_state_dict(policy.base_model.state_dict())
    critic.config.use_cache = False
    return disable_dropout(critic)


def neutral_generation_config(model, tokenizer, eos_token_ids: list[int]):
    """A GenerationConfig holding only token ids. A checkpoint's generation_config.json may set a
    repetition penalty, top_k, min_p, ...; `generate` fills unset arguments from it, so sampling would
    not follow the rollout.* keys (and the trained log-probs). The rollout passes every sampling knob."""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=getattr(model.config, "bos_token_id", None), eos_token_id=eos_token_ids,
                            pad_token_id=tokenizer.pad_token_id)


def build_modules(config: Config, source: ModelSource):
    """Tokenizer, policy, reference (a frozen copy, or None), value model (or None) and teacher (or None), on
    the CPU.

    The reference is copied before any update, so it starts from the policy's weights; the hf and
    fsdp workers both build their modules here and differ only in where they put them. With
    model.lora the policy and the value model are peft models and no reference is copied: the
    worker makes it a view of the policy with the adapter disabled (nanoverl_hf.lora).
    """
    lora = config.model.lora.enable
    if lora:
        from .lora import require_peft
        require_peft()                                  # the install line before any model loads
    tokenizer = load_tokenizer(config.model, source)
    policy = load_policy(config, source)
    policy.generation_config = neutral_generation_config(policy, tokenizer, stop_token_ids(tokenizer, policy))
    if len(tokenizer) > policy.config.vocab_size:
        log.warning("the tokenizer has %d tokens but the model's vocab_size is %d", len(tokenizer),
                    policy.config.vocab_size)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if config.reference.enable and not lora else None
    teacher = build_teacher(config, policy)                  # before LoRA: a checkpoint teacher is a plain model
    critic = build_value_model(policy, config) if config.critic.enable else None
    if config.model.gradient_checkpointing:
        for module in (policy, critic):
            if module is not None:
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from .lora import apply_lora
        policy = apply_lora(policy, config)
        critic = apply_lora(critic, config, value_model=True) if critic is not None else None
    return tokenizer, policy, reference, critic, teacher
