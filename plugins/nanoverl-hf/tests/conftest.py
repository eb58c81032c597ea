"""Shared fixtures: tiny from-scratch models built in temporary folders, one CPU thread, no hub."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from nanoverl_core import RLBatch, load_config, load_registry
from nanoverl_hf.tiny import build_tiny_model

torch.set_num_threads(1)

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}={% endif %}")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """config.json + character tokenizer over digits and '=', no weights (random init from the seed)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def chat_dir(tmp_path_factory):
    """The same tiny model with a chat template that renders [{'content': '12'}] as '12='."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_chat") / "model", chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(f'{{"prompt": "{i:04d}=", "target": "{i:04d}"}}\n' for i in range(0, 9999, 97)))
    return path


@pytest.fixture
def make_config(train_file):
    def make(model_dir, *overrides: str):
        return load_config(None, [f"data.train_files=[{train_file}]", f"model.path={model_dir}",
                                  "worker.name=hf", "rollout.name=hf", "trainer.device=cpu",
                                  "data.batch_size=2", *overrides], registry=load_registry())
    return make


def prompt_batch(tokenizer, texts: list[str], width: int | None = None) -> RLBatch:
    """Left-padded prompts (B, P) as the trainer builds them; `width` adds extra padding columns."""
    ids = [tokenizer.encode(t) for t in texts]
    width = width or max(map(len, ids))
    prompts = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, tokens in enumerate(ids):
        prompts[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return RLBatch({"prompts": prompts, "prompt_mask": mask})


def with_responses(batch: RLBatch, responses: list[list[int]], pad: int, width: int | None = None) -> RLBatch:
    """Add right-padded responses and their mask (every listed token counts)."""
    width = width or max(map(len, responses))
    ids = torch.full((len(responses), width), pad, dtype=torch.long)
    mask = torch.zeros((len(responses), width))
    for row, tokens in enumerate(responses):
        ids[row, :len(tokens)] = torch.tensor(tokens)
        mask[row, :len(tokens)] = 1
    out = RLBatch(dict(batch.tensors))
    out["responses"], out["response_mask"] = ids, mask
    return out
