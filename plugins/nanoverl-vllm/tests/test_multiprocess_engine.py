"""With VLLM_ENABLE_V1_MULTIPROCESSING=1 the engine core is a separate process that tensors cannot
reach, so the rollout saves the weights and has the engine reload them from disk. Run in a child
process: vLLM spawns its engine core there, which needs a guarded __main__."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")

SCRIPT = """
import sys
import torch
sys.path.insert(0, {tests!r})
from conftest import prompt_batch
from nanoverl_core import SamplingParams, load_config
from nanoverl_hf.rollout import HFRollout
from nanoverl_hf.workers import make_workers
from nanoverl_vllm import engine
from nanoverl_vllm.rollout import VLLMRollout

def main():
    torch.set_num_threads(1)
    cfg = load_config(None, ["data.train_files=[{train}]", "model.path={model}", "worker.name=hf",
                             "rollout.name=vllm", "trainer.device=cpu", "data.batch_size=2",
                             "data.max_prompt_length=16"])
    workers = make_workers(cfg)
    rollout = VLLMRollout(cfg, workers)
    assert not engine.in_process()
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    batch = prompt_batch(workers.tokenizer, ["12=", "9=", "5555=", "301=", "77="])
    gen = torch.Generator().manual_seed(0)
    for step in range(2):
        with torch.no_grad():
            for p in workers.actor.module.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
        rollout.sync_weights(workers.actor)
        got = rollout.generate(batch, greedy)["responses"]
        want = HFRollout(cfg, workers).generate(batch, greedy)["responses"]
        assert torch.equal(got, want), (step, got.tolist(), want.tolist())
    assert rollout.restarts == 0
    rollout.close()
    print("OK", len(set(map(tuple, got.tolist()))))

if __name__ == "__main__":
    main()
"""


@pytest.mark.engine
def test_weights_reach_an_engine_in_another_process_through_disk(tmp_path, tiny_dir, train_file):
    script = tmp_path / "mp_sync.py"
    tests = str(Path(__file__).parent)
    script.write_text(textwrap.dedent(SCRIPT).format(tests=tests, train=train_file, model=tiny_dir))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("OK") and int(last.split()[1]) >= 3              # varied answers
