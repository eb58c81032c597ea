"""Shared fixtures: tiny from-scratch Llama models in temporary folders, one CPU thread, no hub.

The engine tests need vLLM (they run in .venv-vllm, see .ci/vllm-env.sh) and skip without it; the
listing tests run anywhere nanoverl-vllm is installed.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest
import torch

from nanoverl_core import RLBatch, load_config, load_registry

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """config.json + character tokenizer over digits and '=', no weights. Two heads of 32: vLLM's CPU
    attention has no kernel for head_dim 16 (the hf plugin's 4-head default)."""
    from nanoverl_hf.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", heads=2)


@pytest.fixture(scope="session")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(f'{{"prompt": "{i:04d}=", "target": "{i:04d}"}}\n' for i in range(0, 9999, 97)))
    return path


@pytest.fixture(scope="session")
def make_config(train_file):
    def make(model_dir, *overrides: str):
        return load_config(None, [f"data.train_files=[{train_file}]", f"model.path={model_dir}",
                                  "worker.name=hf", "rollout.name=vllm", "trainer.device=cpu", "data.batch_size=2",
                                  "data.max_prompt_length=16", "rollout.max_new_tokens=12", "data.val_batch_size=8",
                                  *overrides], registry=load_registry())
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


def kept(out: RLBatch, row: int) -> list[int]:
    """The response tokens of one row that the mask keeps."""
    return out["responses"][row][out["response_mask"][row].bool()].tolist()
