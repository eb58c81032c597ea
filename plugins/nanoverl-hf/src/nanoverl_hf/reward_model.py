"""`reward_model`: a learned reward, a local sequence-classification model scoring (prompt, response) pairs.

The TRL way (`GRPOTrainer(reward_funcs=AutoModelForSequenceClassification...)`): each pair is rendered
as one text, the model's logit (`label`, default 0: a `num_labels=1` reward model) is the score. With
`use_chat_template` and a chat-format row (its "prompt" a list of messages) and a reward tokenizer that has
a chat template, the pair is the conversation plus the response as the assistant's turn, rendered with the
*reward model's* template; otherwise it is the prompt as the policy saw it followed by the response.

It is a *batched* reward (`reward_model.batched = True`): the runtime calls it once per step with
every row, in the one worker process of batched rewards (in the trainer with reward.workers = 0), so
the model is loaded once (on first use, then kept) and runs in batches of `batch_size` on `device`; a
crash or a hang there costs that step's scores, not the run. Configure it as

    [reward]
    name = "reward_model"

    [reward.reward_model]
    path = "/models/my-rm"      # a local AutoModelForSequenceClassification folder
    device = "auto"             # the policy's GPU when there is one (see docs/plugins.md on placement)
    dtype = "bfloat16"
    batch_size = 16
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs

from nanoverl_core.config import DType, at_least
from nanoverl_core.errors import RewardError


def _not_empty(_instance, attribute, value):
    if not value:
        raise ValueError(f"'{attribute.name}' must name a local sequence-classification model folder")


@attrs.define
class RewardModelSettings:
    path: str = attrs.field(default="", validator=_not_empty)
    """A local folder holding an AutoModelForSequenceClassification (config, weights, tokenizer)."""
    batch_size: int = attrs.field(default=8, validator=at_least(1))
    """Pairs per forward pass (bounds the reward model's activation memory)."""
    device: str = "auto"
    """"auto" (this process's GPU, cuda:LOCAL_RANK under torchrun, when there is one; else cpu), "cpu", "cuda:N"."""
    dtype: DType = "float32"
    """Parameter dtype of the reward model."""
    max_length: int = attrs.field(default=1024, validator=at_least(1))
    """Tokens per pair; longer pairs keep their end (the response) and lose the start of the prompt."""
    label: int = attrs.field(default=0, validator=at_least(0))
    """Which logit is the score (0 for a num_labels=1 reward model)."""
    use_chat_template: bool = True
    """Render chat rows with the reward model's own chat template (prompt messages + the response)."""


_LOADED: dict[tuple, tuple[Any, Any, Any]] = {}


def _device(name: str):
    import torch
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RewardError(f"reward.reward_model.device = {name!r} but CUDA is not available; use auto or cpu")
    return torch.device(name)


def load(settings: RewardModelSettings):
    """(model, tokenizer, device), loaded once per (path, device, dtype) and kept for the run."""
    key = (settings.path, settings.device, settings.dtype)
    if key not in _LOADED:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not (Path(settings.path) / "config.json").is_file():
            raise RewardError(f"reward.reward_model.path = {settings.path!r} is not a model folder (no config.json); "
                              "name a local AutoModelForSequenceClassification folder")
        device = _device(settings.device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(settings.path)
            model = AutoModelForSequenceClassification.from_pretrained(settings.path,
                                                                       dtype=getattr(torch, settings.dtype))
        except (OSError, ValueError) as exc:
            raise RewardError(f"reward.reward_model.path = {settings.path!r} cannot be loaded as a sequence "
                              f"classifier ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.truncation_side = "left"   # keep the response
        model.config.pad_token_id = tokenizer.pad_token_id
        _LOADED[key] = (model.to(device).eval(), tokenizer, device)
    return _LOADED[key]


def pair_text(tokenizer, prompt: str, response: str, sample: dict, use_chat_template: bool) -> str:
    """One (prompt, response) pair as the reward model reads it."""
    messages = sample.get("prompt")
    if use_chat_template and getattr(tokenizer, "chat_template", None) and isinstance(messages, list) \
            and all(isinstance(m, dict) and "content" in m for m in messages):
        return tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
    return prompt + response


def reward_model(prompts: list[str], responses: list[str], samples: list[dict], settings: RewardModelSettings
                 ) -> list[float]:
    """The reward model's score of every (prompt, response) pair, in batches of settings.batch_size."""
    import torch

    model, tokenizer, device = load(settings)
    texts = [pair_text(tokenizer, p, r, s, settings.use_chat_template) for p, r, s in zip(prompts, responses, samples)]
    if settings.label >= model.config.num_labels:
        raise RewardError(f"reward.reward_model.label = {settings.label} but the model has "
                          f"{model.config.num_labels} labels")
    scores: list[float] = []
    with torch.no_grad():
        for start in range(0, len(texts), settings.batch_size):
            enc = tokenizer(texts[start:start + settings.batch_size], return_tensors="pt", padding=True,
                            truncation=True, max_length=settings.max_length, add_special_tokens=False)
            logits = model(**{k: v.to(device) for k, v in enc.items()}).logits
            scores += logits[:, settings.label].float().cpu().tolist()
    return scores


reward_model.batched = True
