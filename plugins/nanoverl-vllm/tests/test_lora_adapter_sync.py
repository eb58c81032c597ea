"""[rollout.vllm] lora_sync = "adapter": the engine holds the frozen base, each sync sends the adapter alone
(a peft save_pretrained folder in a new LoRARequest), and greedy output equals HF with the adapter on,
and equals merged mode's; plus the combinations refused with exit 2 before any model loads.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("peft")

from conftest import kept, prompt_batch  # noqa: E402
from test_engine import GREEDY, PROMPTS, train_to_answer  # noqa: E402

from nanoverl_core import ConfigError  # noqa: E402
from nanoverl_core.cli import main  # noqa: E402
from nanoverl_hf.rollout import HFRollout  # noqa: E402
from nanoverl_hf.workers import make_workers  # noqa: E402
from nanoverl_vllm.rollout import VLLMRollout  # noqa: E402

LORA = ["trainer.seed=3", "actor.lr=3e-2", "model.lora.enable=true", "model.lora.rank=8", "model.lora.alpha=16"]


# ---- refused combinations (config level: exit 2 before a model loads, no engine) ----------------
@pytest.mark.parametrize("overrides, words", [
    (['rollout.vllm.lora_sync="adapter"'], ["model.lora.enable = false", "valid choices: merged, adapter"]),
    ([*LORA, 'model.lora.target_modules=["q_proj", "embed_tokens"]', 'rollout.vllm.lora_sync="adapter"'],
     ["'embed_tokens'", 'lora_sync = "merged"']),
    ([*LORA, "model.lora.rank=1024", 'rollout.vllm.lora_sync="adapter"'], ["max_lora_rank", "lower model.lora.rank"]),
    ([*LORA, 'rollout.vllm.lora_sync="lora"'], ["rollout.vllm.lora_sync", "'merged', 'adapter'"]),
])
def test_adapter_sync_refuses_what_vllm_lora_cannot_serve(tiny_dir, train_file, tmp_path, capsys, overrides, words):
    (tmp_path / "c.toml").write_text("")
    rc = main(["--config", str(tmp_path / "c.toml"), f"data.train_files=[{train_file}]", f"model.path={tiny_dir}",
               "worker.name=hf", "rollout.name=vllm", "trainer.device=cpu", "algorithm.advantage_estimator=grpo",
               f"trainer.output_dir={tmp_path / 'run'}", *overrides])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "run").exists()                      # refused before the run directory is written


def test_an_adapted_embedding_matched_by_another_name_is_refused_by_the_rollout(tiny_dir, make_config):
    """The config check reads names; the rollout also looks at the peft model (before any engine starts)."""
    cfg = make_config(tiny_dir, *LORA, 'model.lora.target_modules=["q_proj", "embed_tokens"]')
    workers = make_workers(cfg)
    cfg.rollout.settings.lora_sync = "adapter"
    cfg.model.lora.target_modules = ["q_proj"]                   # what the config check sees; the module still has it
    with pytest.raises(ConfigError, match="adapted embedding"):
        VLLMRollout(cfg, workers)


# ---- the real engine --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tiny_dir, make_config):
    """A LoRA actor on a scrambled base, after real updates toward "777777"."""
    cfg = make_config(tiny_dir, *LORA, 'rollout.vllm.lora_sync="adapter"')
    workers = make_workers(cfg)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in workers.actor.module.parameters():                 # a varied base, adapter untouched
            if not p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return cfg, workers


@pytest.mark.engine
def test_adapter_sync_equals_hf_with_the_adapter_and_merged_sync(trained):
    cfg, workers = trained
    tok = workers.tokenizer
    batch = prompt_batch(tok, ["12=", "34=", *PROMPTS[1:]], width=10)
    rollout = VLLMRollout(cfg, workers)
    try:
        assert rollout.adapter_mode and rollout.llm.llm_engine.vllm_config.lora_config.max_lora_rank == 8
        start = rollout.generate(batch, GREEDY)
        assert torch.equal(start["responses"], HFRollout(cfg, workers).generate(batch, GREEDY)["responses"])
        target = [11] * 6
        assert kept(start, 0) != target
        train_to_answer(workers, target)
        state = {k: v.clone() for k, v in workers.actor.module.state_dict().items()}
        outs = []
        for _ in range(3):                                                   # repeated syncs: no drift, one adapter
            rollout.sync_weights(workers.actor)
            outs.append(rollout.generate(batch, GREEDY))
            assert rollout.llm.llm_engine.list_loras() == {rollout.lora_request.lora_int_id}
        assert rollout.lora_request.lora_int_id == 4                        # start + 3 syncs, a new id each
        assert sorted(p.name for p in rollout.folder.glob("adapter-*")) == ["adapter-4"]
        assert all(torch.equal(v, state[k]) for k, v in workers.actor.module.state_dict().items())
        after = outs[0]
        assert all(torch.equal(o["responses"], after["responses"]) for o in outs[1:])
        assert kept(after, 0) == target and kept(after, 1) == target
        want = HFRollout(cfg, workers).generate(batch, GREEDY)              # HF with the peft module, adapter on
        assert torch.equal(after["responses"], want["responses"])
        assert torch.equal(after["response_mask"], want["response_mask"])
        assert len({tuple(kept(after, r)) for r in range(len(batch))}) >= 2

        # a second update toward another answer: the new adapter is served, not a cached one
        train_to_answer(workers, [5] * 6, steps=40)
        rollout.sync_weights(workers.actor)
        second = rollout.generate(batch, GREEDY)
        assert not torch.equal(second["responses"], after["responses"])
        assert torch.equal(second["responses"], HFRollout(cfg, workers).generate(batch, GREEDY)["responses"])

        # a failed sync restarts the engine from the base + the current adapter
        save, restarts = workers.actor.save_adapter, rollout.restarts

        def fail_once(folder):
            workers.actor.save_adapter = save
            raise OSError("disk full")

        workers.actor.save_adapter = fail_once
        rollout.sync_weights(workers.actor)                                  # logs a warning, then restarts
        workers.actor.save_adapter = save
        assert rollout.restarts == restarts + 1 and rollout.lora_request is not None
        assert torch.equal(rollout.generate(batch, GREEDY)["responses"], second["responses"])
    finally:
        rollout.close()

    cfg.rollout.settings.lora_sync = "merged"                                # the same actor, merged weights
    merged = VLLMRollout(cfg, workers)
    try:
        assert not merged.adapter_mode and merged.lora_request is None
        assert torch.equal(merged.generate(batch, GREEDY)["responses"], second["responses"])
    finally:
        merged.close()
        cfg.rollout.settings.lora_sync = "adapter"
