"""One update on 2 FSDP ranks equals the single-process hf worker's, and the export reproduces the policy.

The fsdp side runs under a real `torchrun --nproc_per_node=2` (gloo, CPU); the hf side in this process.
Both run update_driver.py: the same config, fixed batch and seed (policy, reference and critic; two
epochs of two mini-batches of micro-batches, a binding grad clip, then an odd-sized batch that makes
one rank pad its share).
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from nanoverl_core.testing import check_actor
from conftest import HERE, assert_same_steps, assert_same_update, run, torchrun

sys.path.insert(0, str(HERE))
import update_driver  # noqa: E402

# Float32 sums in a different order (two half-batches, then an all-reduce) differ in the last bits: log-probs,
# values and metrics to ATOL. Parameters are compared step by step, the hf side taking each step from the
# fsdp side's weights (update_driver.record_steps): Adam turns rounding on near-zero gradients into steps of
# ~lr (1e-2 here), and compared after all 5 steps they reached 0.58-0.97 ATOL with the CPU's kernels and threads.
ATOL = 1e-5


@pytest.fixture(scope="module")
def results(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("update")
    run(torchrun(2, str(HERE / "update_driver.py"), "--worker", "fsdp", "--model", str(tiny_model),
                 "--out", str(tmp / "fsdp.pt"), "--ckpt", str(tmp / "checkpoint")), timeout=150)
    fsdp = torch.load(tmp / "fsdp.pt")
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, replay=fsdp)
    return hf, fsdp, tmp


def test_two_ranks_give_the_single_process_log_probs_values_metrics_and_parameters(results):
    hf, fsdp, _ = results
    assert_same_update(hf, fsdp, ATOL)                              # 2 ranks = 1 process
    assert hf["actor_metrics"]["actor/grad_norm"] > 0.3            # the clip (0.3) was active
    assert hf["actor_metrics"]["actor/pg_clipfrac"] > 0             # and so was the PPO clip
    for model in ("actor", "critic"):
        moved = max((hf[model][k] - hf["initial"].get(k, hf[model][k])).abs().max() for k in hf[model])
        assert moved > 1e-2                                         # the update changed the weights


def test_packed_on_two_ranks_gives_the_padded_single_process_update(results, tiny_model, tmp_path):
    """The ranks pack their micro-batches (actor.pack = "auto": the tiny sdpa Llama packs each micro-batch in
    one line, attended row by row), by rows and by a token budget of real tokens; one process runs padded
    rectangles: the same log-probs, values, metrics and optimizer steps, to the ATOL of two padded ranks."""
    _, fsdp, _ = results
    assert fsdp["packing"] == ["rows", "rows"]
    padded = ("actor.pack=false", "critic.pack=false")
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, replay=fsdp, extra=padded)
    assert hf["packing"] == [None, None]
    assert_same_update(hf, fsdp, ATOL)
    budget = ["actor.micro_batch_size=0", "actor.max_tokens_per_micro_batch=20",
              "critic.micro_batch_size=0", "critic.max_tokens_per_micro_batch=14"]
    run(torchrun(2, str(HERE / "update_driver.py"), "--worker", "fsdp", "--model", str(tiny_model),
                 "--out", str(tmp_path / "budget.pt"), "--", *budget), timeout=150)
    fsdp = torch.load(tmp_path / "budget.pt")
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, replay=fsdp, extra=padded)
    for key in ("log_probs", "ref_log_probs", "values"):
        torch.testing.assert_close(fsdp[key], hf[key], atol=ATOL, rtol=0, msg=key)
    for key in ("critic_metrics", "actor_metrics"):
        for name, want in hf[key].items():
            assert fsdp[key][name] == pytest.approx(want, abs=ATOL, rel=1e-5), (key, name)
    assert_same_steps(hf, fsdp, ATOL)


def test_a_token_budget_on_two_ranks_gives_the_single_process_fixed_split_update(results, tiny_model, tmp_path):
    """max_tokens_per_micro_batch under FSDP: each rank groups its rows by length, every rank runs the
    largest group count (a pass is a collective), and the update equals one process's fixed split."""
    hf, _, _ = results
    budget = ["actor.micro_batch_size=0", "actor.max_tokens_per_micro_batch=20",
              "critic.micro_batch_size=0", "critic.max_tokens_per_micro_batch=14"]
    run(torchrun(2, str(HERE / "update_driver.py"), "--worker", "fsdp", "--model", str(tiny_model),
                 "--out", str(tmp_path / "budget.pt"), "--", *budget), timeout=150)
    fsdp = torch.load(tmp_path / "budget.pt")
    for key in ("log_probs", "ref_log_probs", "values"):
        torch.testing.assert_close(fsdp[key], hf[key], atol=ATOL, rtol=0, msg=key)
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, replay=fsdp)          # each step from the budget run's weights
    # Every loss, fraction and gradient norm of the 5 optimizer steps agrees (other split sums: float32
    # rounding, grad norms to 2e-6 relative), and so do each step's gradients and well-conditioned parameters
    for key in ("critic_metrics", "actor_metrics"):
        for name, want in hf[key].items():
            assert fsdp[key][name] == pytest.approx(want, abs=ATOL, rel=1e-5), (key, name)
    assert_same_steps(hf, fsdp, ATOL)


def test_exported_policy_loads_in_transformers_with_the_fsdp_logits(results):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nanoverl_fsdp.export import export

    _, fsdp, tmp = results
    out = export(tmp / "checkpoint", tmp / "final_model")
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        logits = model(input_ids=fsdp["logits_input"]).logits
    torch.testing.assert_close(logits, fsdp["logits"], atol=1e-6, rtol=0)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in fsdp["actor"].items())   # bit for bit the trained weights
    assert AutoTokenizer.from_pretrained(out).decode([5, 6]) == "23"


def test_the_checkpoint_holds_only_safetensors_json_and_weights_only_tensors(results):
    from safetensors.torch import load_file

    _, _, tmp = results
    files = {p.name: p for p in (tmp / "checkpoint" / "actor").iterdir() if p.is_file()}
    assert set(files) == {"model_rank0.safetensors", "model_rank1.safetensors", "optimizer_rank0.pt",
                          "optimizer_rank1.pt", "shards.json", "scheduler.json"}
    for name, path in files.items():
        if name.endswith(".pt"):
            assert torch.load(path, weights_only=True)["state"]      # raises on anything but plain tensor data
        elif name.endswith(".safetensors"):
            assert load_file(path)
        else:
            json.loads(path.read_text())


def test_without_torchrun_the_fsdp_worker_is_a_world_of_one_with_the_same_update(results, tiny_model):
    import torch.distributed as dist

    from nanoverl_fsdp.workers import make_workers

    hf, _, tmp = results
    try:
        torch.manual_seed(0)
        one = update_driver.run("fsdp", tiny_model)               # no torchrun: a process group of one
        assert dist.get_world_size() == 1
        workers = make_workers(update_driver.make_config("fsdp", tiny_model))
        actor = workers.actor
        with pytest.raises(ValueError, match="saved by 2 ranks; resume it on 2 ranks, not 1"):
            actor.load(tmp / "checkpoint" / "actor")               # shards resume on their own world size only
        check_actor(actor, update_driver.fixed_batch(workers.tokenizer))   # the core's Actor contract, sharded
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, replay=one)            # each step from the world of one's weights
    assert_same_steps(hf, one, ATOL)
    for model in ("actor", "critic"):
        for name, want in hf[model].items():
            torch.testing.assert_close(one[model][name], want, atol=ATOL, rtol=0, msg=f"{model} {name}")
    assert one["actor_metrics"]["actor/loss"] == pytest.approx(hf["actor_metrics"]["actor/loss"], abs=ATOL)


@pytest.mark.skipif(not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")),
                    reason="torch.compile's CPU kernels need a C++ compiler")
def test_compiled_norms_and_mlps_on_two_ranks_give_the_eager_single_process_update(tiny_model, tmp_path):
    """model.compile under FSDP2: each block's unshard / reshard hooks stay outside the compiled parts (its
    norms and MLP), and two compiled ranks give the eager single process's update (log-probs, values,
    metrics, every optimizer step) to the same ATOL as the eager ranks."""
    run(torchrun(2, str(HERE / "update_driver.py"), "--worker", "fsdp", "--model", str(tiny_model),
                 "--out", str(tmp_path / "compiled.pt"), "--", "model.compile=true"), timeout=300)
    fsdp = torch.load(tmp_path / "compiled.pt")
    torch.manual_seed(0)
    hf = update_driver.run("hf", tiny_model, replay=fsdp)
    assert_same_update(hf, fsdp, ATOL)
