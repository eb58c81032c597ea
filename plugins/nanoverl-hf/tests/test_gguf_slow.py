"""SmolLM2-135M-Instruct from its GGUF file: opt-in, minutes on CPU, not for CI.

    bash plugins/nanoverl-hf/scripts/fetch_smollm2.sh
    NANOVERL_SLOW=1 pytest plugins/nanoverl-hf/tests/test_gguf_slow.py -q
The file is looked up at $NANOVERL_SMOLLM2_GGUF, else models/SmolLM2-135M-Instruct.Q4_1.gguf.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
GGUF = Path(os.environ.get("NANOVERL_SMOLLM2_GGUF", REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("NANOVERL_SLOW") != "1", reason="set NANOVERL_SLOW=1 to run"),
    pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} is missing (scripts/fetch_smollm2.sh)"),
]


@pytest.fixture(scope="module")
def smol(train_file, tmp_path_factory):
    from nanoverl_core import load_config, load_registry
    from nanoverl_hf.rollout import make_rollout
    from nanoverl_hf.workers import make_workers
    cfg = load_config(None, [f"data.train_files=[{train_file}]", f"model.path={GGUF}", "trainer.device=cpu",
                             "worker.name=hf", "rollout.name=hf", "data.batch_size=2", "critic.enable=true",
                             "critic.lr=1e-6"], registry=load_registry())
    workers = make_workers(cfg)
    return cfg, workers, make_rollout(cfg, workers)


def test_gguf_model_answers_a_chat_prompt_and_stops_at_im_end(smol):
    from conftest import prompt_batch
    from nanoverl_core import SamplingParams
    _, workers, rollout = smol
    tok = workers.tokenizer
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False,
                                   add_generation_prompt=True)
    batch = prompt_batch(tok, [text])
    out = rollout.generate(batch, SamplingParams(max_new_tokens=40, temperature=0.0))
    length = int(out["response_mask"][0].sum())
    response = out["responses"][0, :length].tolist()
    assert response[-1] == tok.eos_token_id and length < 40
    assert "5" in tok.decode(response, skip_special_tokens=True)


def test_gguf_model_is_a_plain_float_model_that_saves(smol, tmp_path):
    from safetensors.torch import load_file
    _, workers, _ = smol
    module = workers.actor.module
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert sum(p.numel() for p in module.parameters()) == 134_515_008
    workers.actor.save(tmp_path / "actor")
    saved = load_file(str(tmp_path / "actor" / "model.safetensors"))
    torch.testing.assert_close(saved["model.norm.weight"], module.model.norm.weight.detach())
    assert workers.critic.module.config.num_labels == 1
