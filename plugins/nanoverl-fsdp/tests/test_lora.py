"""LoRA on 2 FSDP ranks equals the single-process hf worker's LoRA update, and its checkpoint holds the
adapter alone and exports (merged) to the FSDP policy's logits.

The same driver as test_update_equivalence.py (policy, adapter-off reference with a KL loss, LoRA
critic with a full value head; two epochs of two mini-batches of micro-batches, a binding grad clip,
then an odd-sized batch), with [model.lora] switched on.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("peft")

from conftest import HERE, assert_same_update, run, torchrun  # noqa: E402

sys.path.insert(0, str(HERE))
import update_driver  # noqa: E402

LORA = ("model.lora.enable=true", "model.lora.rank=4", "model.lora.alpha=16")
ATOL = 1e-5


@pytest.fixture(scope="module")
def results(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    run(torchrun(2, str(HERE / "update_driver.py"), "--worker", "fsdp", "--model", str(tiny_model),
                 "--out", str(tmp / "fsdp.pt"), "--ckpt", str(tmp / "checkpoint"), "--", *LORA), timeout=200)
    fsdp = torch.load(tmp / "fsdp.pt")
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, extra=LORA, replay=fsdp)   # each step from the fsdp side's weights
    return hf, fsdp, tmp


def test_a_two_rank_lora_update_equals_one_process(results):
    hf, fsdp, _ = results
    assert_same_update(hf, fsdp, ATOL)
    assert any(".lora_A." in k for k in hf["actor"]) and any(".lora_B." in k for k in hf["critic"])
    assert hf["actor_metrics"]["actor/kl_loss"] > 0                   # the adapter moved off the reference
    for model in ("actor", "critic"):
        frozen = [k for k in hf[model] if ".lora_" not in k and "modules_to_save" not in k]
        assert all(torch.equal(hf[model][k], hf["initial"][k]) for k in frozen if k in hf["initial"])
        moved = max((hf[model][k] - hf["initial"].get(k, hf[model][k])).abs().max() for k in hf[model])
        assert moved > 1e-2


def test_the_checkpoint_holds_the_adapter_shards_and_exports_merged(results, tiny_model):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from nanoverl_fsdp.export import ExportError, export

    hf, fsdp, tmp = results
    actor = tmp / "checkpoint" / "actor"
    shards = json.loads((actor / "shards.json").read_text())
    assert shards["lora"] and all(".lora_" in name for name in shards["model"])        # no frozen base entry
    assert json.loads((actor / "adapter_config.json").read_text())["r"] == 4
    saved = load_file(str(actor / "model_rank0.safetensors"))
    assert saved and all(".lora_" in name for name in saved)
    with pytest.raises(ExportError, match="holds a LoRA adapter"):
        export(tmp / "checkpoint", tmp / "no_config")                                  # the base is in the run config
    config = update_driver.make_config("fsdp", tiny_model, LORA)
    out = export(tmp / "checkpoint", tmp / "final_model", config)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name in model.state_dict())
    with torch.no_grad():
        logits = model(input_ids=fsdp["logits_input"]).logits
    torch.testing.assert_close(logits, fsdp["logits"], atol=ATOL, rtol=0)


def test_a_sharded_lora_checkpoint_round_trips_and_keeps_the_actor_contract(tiny_model, tmp_path):
    """In a world of one (no torchrun): save after an update, load into fresh workers, same log-probs,
    same optimizer state; the adapter-off reference keeps the base's log-probs."""
    import torch.distributed as dist

    from nanoverl_core.algos import vanilla
    from nanoverl_core.testing import check_actor
    from nanoverl_fsdp.workers import make_workers

    config = update_driver.make_config("fsdp", tiny_model, LORA)
    try:
        torch.manual_seed(0)
        workers = make_workers(config)
        batch = update_driver.fixed_batch(workers.tokenizer)
        batch["old_log_probs"] = workers.actor.compute_log_probs(batch) + batch.pop("old_log_probs_offset")
        base = workers.reference.compute_log_probs(batch)
        batch["ref_log_probs"] = base
        workers.actor.update(batch, vanilla)
        trained = workers.actor.compute_log_probs(batch)
        assert torch.equal(workers.reference.compute_log_probs(batch), base)
        workers.actor.save(tmp_path / "actor")
        fresh = make_workers(config)
        fresh.actor.load(tmp_path / "actor")
        assert torch.equal(fresh.actor.compute_log_probs(batch), trained)
        a, b = workers.actor.optimizer.state_dict()["state"], fresh.actor.optimizer.state_dict()["state"]
        assert a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"].to_local(), b[k]["exp_avg"].to_local())
                                            for k in a)
        check_actor(fresh.actor, update_driver.fixed_batch(fresh.tokenizer))              # one update included
        check_actor(fresh.reference, update_driver.fixed_batch(fresh.tokenizer), update=False)   # adapter off
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
