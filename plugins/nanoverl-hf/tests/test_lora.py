"""LoRA ([model.lora], through peft): adapter-only training, the adapter-off reference, checkpoints,
exact resume, merged weights for rollouts and export, the critic, and the user errors.

Without peft installed (the nox `hf` session) only the last test runs: asking for LoRA exits 2 with
the install line. The `hf_lora` session runs them all.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from conftest import prompt_batch, with_responses
from test_cli import ENV, NO_GRPO, REPO, train

from nanoverl_core.testing import without_machine_metrics

HAS_PEFT = importlib.util.find_spec("peft") is not None
needs_peft = pytest.mark.skipif(not HAS_PEFT, reason="needs peft (pip install 'nanoverl-hf[lora]')")
LORA = ["model.lora.enable=true", "model.lora.rank=4", "model.lora.alpha=8"]
QUIET = ["trainer.progress=none", "tracking.trackers=[jsonl]"]


def batch_of(tok):
    return with_responses(prompt_batch(tok, ["12=", "9876=", "5="]), [[5, 6, 2], [7], [9, 9, 9, 2]], tok.pad_token_id)


def advantage_batch(workers, seed: int = 0):
    """A batch with old log-probs and random advantages: what the trainer hands an update."""
    batch = batch_of(workers.tokenizer)
    gen = torch.Generator().manual_seed(seed)
    batch["old_log_probs"] = workers.actor.compute_log_probs(batch)
    batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=gen) * batch["response_mask"]
    from nanoverl_core.testing import with_loss_mask
    with_loss_mask(batch)                                          # every sampled token counts
    return batch


def update(workers, steps: int = 3) -> None:
    from nanoverl_core.algos import vanilla
    for step in range(steps):
        workers.actor.update(advantage_batch(workers, step), vanilla)


@needs_peft
def test_only_the_adapter_trains_and_the_reference_is_the_base_with_the_adapter_off(tiny_dir, make_config):
    from nanoverl_hf.models import load_policy, resolve_source
    from nanoverl_hf.workers import make_workers
    from nanoverl_core import TorchActor

    cfg = make_config(tiny_dir, *LORA, "reference.enable=true", "actor.lr=3e-2", "trainer.seed=3",
                      "data.batch_size=3")
    workers = make_workers(cfg)
    actor, reference = workers.actor, workers.reference
    trainable = {n for n, p in actor.module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optimised = [p for group in actor.optimizer.param_groups for p in group["params"]]
    # 2 layers x (4 attention projections 64->64 and gate/up 64->128, down 128->64) at rank 4
    assert sum(p.numel() for p in optimised) == 2 * (4 * 4 * (64 + 64) + 3 * 4 * (64 + 128)) == 8704
    # the reference holds no weights of its own: it is a view of the actor's module
    assert list(reference.module.parameters()) == [] and reference.module.peft_model is actor.module
    base_before = {n: p.clone() for n, p in actor.module.named_parameters() if not p.requires_grad}

    update(workers)
    assert all(torch.equal(p, base_before[n]) for n, p in actor.module.named_parameters() if not p.requires_grad)
    assert all(p.requires_grad for n, p in actor.module.named_parameters() if n in trainable)  # not frozen by the ref

    base = TorchActor(load_policy(cfg, resolve_source(cfg.model)), cfg, trainable=False)  # same seed: same weights
    batch = batch_of(workers.tokenizer)
    ref, want, policy = reference.compute_log_probs(batch), base.compute_log_probs(batch), actor.compute_log_probs(batch)
    assert torch.equal(ref, want)                                  # exactly, not approximately
    assert (policy - want).abs().max() > 1e-3                      # the adapter did change the policy
    assert torch.equal(actor.compute_log_probs(batch), policy)     # and is back on after the reference pass


EMBEDDING = "model.lora.target_modules=[embed_tokens,q_proj,v_proj,down_proj]"
"""The adapted embedding: the tiny model ties its head, whose adapter peft ties to the embedding's."""


@needs_peft
def test_base_tensors_and_save_adapter_rebuild_the_policy_through_peft(tiny_dir, make_config, tmp_path):
    """What vLLM's adapter-only sync gets: the frozen W under plain names, and a save_pretrained folder
    that peft loads on that base into the same policy."""
    from peft import PeftModel

    from nanoverl_hf.workers import make_workers

    workers = make_workers(make_config(tiny_dir, *LORA, "actor.lr=3e-2", "data.batch_size=3"))
    update(workers)
    actor = workers.actor
    plain = type(actor.module.get_base_model())(actor.module.get_base_model().config)
    base = dict(actor.base_tensors())
    assert set(base) == set(plain.state_dict()) and not actor.adapted_embedding
    assert actor.lora_rank == actor.config.model.lora.rank
    plain.load_state_dict(base)
    folder = actor.save_adapter(tmp_path / "adapter")
    assert {p.name for p in folder.iterdir()} == {"adapter_model.safetensors", "adapter_config.json"}
    rebuilt = PeftModel.from_pretrained(plain, str(folder)).eval()
    ids = torch.tensor([[1, 4, 5, 6, 7]])
    actor.module.eval()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(input_ids=ids).logits, actor.module(input_ids=ids).logits, rtol=0, atol=1e-6)


@needs_peft
@pytest.mark.parametrize("targets", [[], [EMBEDDING]], ids=["all-linear", "embedding"])
def test_full_tensors_are_the_merged_weights_and_leave_the_module_bit_identical(tiny_dir, make_config, targets,
                                                                                tmp_path):
    from peft.tuners.lora import LoraLayer

    from nanoverl_hf.workers import make_workers

    workers = make_workers(make_config(tiny_dir, *LORA, *targets, "actor.lr=3e-2", "data.batch_size=3"))
    update(workers)
    actor = workers.actor
    before = {k: v.clone() for k, v in actor.module.state_dict().items()}
    merged = dict(actor.full_tensors())
    merged_again = dict(actor.full_tensors())
    after = actor.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)          # no merge / unmerge drift
    assert all(torch.equal(merged[k], merged_again[k]) for k in merged)
    plain = type(actor.module.get_base_model())(actor.module.get_base_model().config)
    assert set(merged) == set(plain.state_dict())                         # plain transformers names
    layer = next(m for m in actor.module.modules() if isinstance(m, LoraLayer) and "default" in m.lora_B)
    assert layer.lora_B["default"].weight.abs().max() > 0                 # trained: the delta is not zero
    actor.save(tmp_path / "actor")           # the adapter alone (no base embedding), and it loads back exactly
    fresh = make_workers(make_config(tiny_dir, *LORA, *targets, "actor.lr=3e-2", "data.batch_size=3")).actor
    fresh.load(tmp_path / "actor")
    assert all(torch.equal(merged[k], v) for k, v in fresh.full_tensors())
    # peft's own merge of that copy gives the same weights (bar peft 0.21's double delta on a tied head)
    reference = fresh.module.merge_and_unload().state_dict()
    for name, tensor in merged.items():
        if targets and name in ("lm_head.weight", "model.embed_tokens.weight"):
            continue
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6)
    plain.load_state_dict(merged)
    batch = batch_of(workers.tokenizer)
    ids = torch.cat([batch["prompts"], batch["responses"]], 1)
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(input_ids=ids).logits, actor.module.eval()(input_ids=ids).logits,
                                   rtol=0, atol=1e-5)
    if targets:                              # the tied head follows the adapted embedding, in the merge too
        assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])
        assert not torch.equal(merged["model.embed_tokens.weight"], before["base_model.model.model.embed_tokens."
                                                                           "base_layer.weight"])


@needs_peft
@pytest.mark.parametrize("targets", [[], [EMBEDDING]], ids=["all-linear", "embedding"])
def test_chunked_log_probs_give_the_full_logits_lora_update(tiny_dir, make_config, targets):
    """actor.logits_chunk_size through peft: the head is hooked inside peft's forward, so the adapter trains
    as with the full logits and the reference (adapter disabled) is the base model's. With an adapted
    embedding the tied head is a LoRA layer itself: not a plain linear head, so the full logits are used."""
    from nanoverl_core.testing import assert_same_adam_step
    from nanoverl_hf.workers import make_workers

    runs = []
    for chunk in (0, 2):
        workers = make_workers(make_config(tiny_dir, *LORA, *targets, "reference.enable=true", "actor.lr=1e-3",
                                           "actor.entropy_coeff=0.05", "rollout.temperature=0.7", "data.batch_size=3",
                                           f"actor.logits_chunk_size={chunk}"))
        chunked = chunk > 0 and not targets
        heads = workers.actor.forward_pass.head, workers.reference.forward_pass.head
        assert (heads[0] is not None) == chunked == (heads[1] is not None)
        # each optimizer step's gradients (as the optimizer sees them) and the adapter after it; the chunked run
        # takes each step from the full-logits run's weights, so the two compare step by step: otherwise Adam,
        # lr * g / (|g| + eps) on its first step, turns rounding on near-zero gradients into weight differences
        # of up to ~lr that step 2 inherits (measured after 2 steps: 2e-7 to 2.4e-6, with the CPU's kernels)
        grads, params, replay = [], [], runs[0][3] if runs else None
        trainable = {n: p for n, p in workers.actor.module.named_parameters() if p.requires_grad}

        def before(optimizer, args, kwargs, grads=grads, trainable=trainable):
            grads.append({n: p.grad.clone() for n, p in trainable.items() if p.grad is not None})

        def after(optimizer, args, kwargs, params=params, trainable=trainable, replay=replay):
            params.append({n: p.detach().clone() for n, p in trainable.items()})
            if replay is not None:
                with torch.no_grad():
                    for n, p in trainable.items():
                        p.copy_(replay[len(params) - 1][n])
        workers.actor.optimizer.register_step_pre_hook(before)
        workers.actor.optimizer.register_step_post_hook(after)
        update(workers, steps=2)
        batch = batch_of(workers.tokenizer)
        runs.append((workers.actor.compute_log_probs(batch), workers.reference.compute_log_probs(batch), grads, params))
    (lp0, ref0, grads0, params0), (lp1, ref1, grads1, params1) = runs
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref1, ref0, rtol=0, atol=1e-6)
    assert (lp0 - ref0).abs().max() > 1e-3                                # the adapter moved the policy
    assert len(grads0) == len(grads1) == len(params0) == 2
    for g0, g1, p0, p1 in zip(grads0, grads1, params0, params1, strict=True):
        assert g0.keys() == g1.keys() and all(".lora_" in n for n in g0)
        # gradients everywhere, the adapter where Adam's step is well conditioned (lora_A's first non-zero
        # gradient comes in step 2: B starts at 0)
        assert_same_adam_step(p1, p0, g1, g0, grad_atol=1e-7)


@needs_peft
def test_the_hf_rollout_generates_with_the_adapter(tiny_dir, make_config):
    from nanoverl_core import SamplingParams
    from nanoverl_hf.rollout import HFRollout
    from nanoverl_hf.workers import make_workers

    cfg = make_config(tiny_dir, *LORA, "actor.lr=3e-2", "data.batch_size=3", "trainer.seed=5")
    workers = make_workers(cfg)
    update(workers, 4)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    batch = prompt_batch(workers.tokenizer, ["12=", "9876=", "5="])
    shared = HFRollout(cfg, workers)                  # the actor's peft module itself
    copied = HFRollout(cfg, workers, share=False)     # a plain model fed merged full_tensors
    assert shared.module is workers.actor.module and not hasattr(copied.module, "peft_config")
    a, b = shared.generate(batch, greedy), copied.generate(batch, greedy)
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["response_mask"], b["response_mask"])


@needs_peft
def test_the_critic_trains_its_adapter_and_its_whole_value_head(tiny_dir, make_config, tmp_path):
    from nanoverl_hf.workers import make_workers

    cfg = make_config(tiny_dir, *LORA, "critic.enable=true", "critic.lr=1e-2", "data.batch_size=3")
    workers = make_workers(cfg)
    critic = workers.critic
    trainable = {n for n, p in critic.module.named_parameters() if p.requires_grad}
    head = {n for n in trainable if ".lora_" not in n}
    assert head and all(".score." in n for n in head)                       # the head in full: weight and bias
    assert sum(p.numel() for n, p in critic.module.named_parameters() if n in head) == 64 + 1
    batch = batch_of(workers.tokenizer)
    batch["values"] = critic.compute_values(batch)
    batch["returns"] = torch.ones_like(batch["values"]) * batch["response_mask"]
    batch["loss_mask"] = batch["response_mask"].clone()
    before = critic.compute_values(batch)
    for _ in range(3):
        critic.update(batch)
    trained = critic.compute_values(batch)
    assert (trained - before).abs().max() > 1e-3
    critic.save(tmp_path / "critic")
    assert not (tmp_path / "critic" / "model.safetensors").exists()
    fresh = make_workers(cfg).critic
    fresh.load(tmp_path / "critic")
    assert torch.equal(fresh.compute_values(batch), trained)


@needs_peft
def test_a_lora_ppo_run_checkpoints_the_adapter_only_and_resumes_exactly(tmp_path):
    """PPO with a LoRA critic, KL loss against the adapter-off reference: 4 steps in one go == 2 + resume 2."""
    common = ["--config", "examples/configs/tiny_ppo.toml", *QUIET, *LORA, "model.lora.dropout=0.1",
              "reference.enable=true", "actor.use_kl_loss=true", "actor.lr=1e-2", "critic.lr=1e-2",
              "trainer.val_every=2", "trainer.save_every=2", "data.batch_size=4", "rollout.n=4"]
    full, half = tmp_path / "full", tmp_path / "half"
    assert train(*common, "trainer.total_steps=4", f"trainer.output_dir={full}").returncode == 0
    assert train(*common, "trainer.total_steps=2", f"trainer.output_dir={half}").returncode == 0
    proc = train(*common, "trainer.total_steps=4", f"trainer.output_dir={half}")
    assert proc.returncode == 0 and "resumed from" in proc.stderr, proc.stderr[-3000:]
    rows = [[without_machine_metrics(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (full, half)]
    assert [r["step"] for r in rows[1]] == [1, 2, 3, 4] and rows[0] == rows[1]
    assert rows[0][-1]["actor/kl_loss"] > 0                                 # the adapter moved away from the base
    ckpt = full / "checkpoints" / "step_000004"
    for part in ("actor", "critic"):
        files = {p.name for p in (ckpt / part).iterdir()}
        assert files == {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.json"}, files
    config = json.loads((ckpt / "actor" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    size = sum(p.stat().st_size for p in (ckpt / "actor").iterdir())
    assert size < 200_000, size                 # the adapter and its Adam moments, not the 83k-parameter base


@needs_peft
def test_export_writes_merged_weights_equal_to_the_adapters_forward(tmp_path):
    from transformers import AutoModelForCausalLM

    from nanoverl_core import load_config, load_registry
    from nanoverl_hf.workers import make_workers

    run = tmp_path / "run"
    proc = train("--config", "examples/configs/tiny_grpo.toml", NO_GRPO, *QUIET, *LORA, "actor.lr=3e-2",
                 "trainer.total_steps=3", "trainer.val_every=0", f"trainer.output_dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "exported"
    proc = train("export", str(run), str(out))
    assert proc.returncode == 0 and f"wrote {out}" in proc.stdout, proc.stderr[-3000:]
    assert not list(out.glob("adapter_*")) and (out / "model.safetensors").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    config = load_config(REPO / "examples/configs/tiny_grpo.toml", ["trainer.device=cpu", *LORA, NO_GRPO],
                         registry=load_registry())
    actor = make_workers(config).actor
    actor.load(run / "checkpoints" / "step_000003" / "actor")
    ids = torch.tensor([[1, 4, 5, 6, 7, 13, 4, 5], [1, 12, 11, 10, 9, 13, 12, 11]])
    with torch.no_grad():
        adapter = actor.module.eval()(input_ids=ids).logits
        torch.testing.assert_close(exported(input_ids=ids).logits, adapter, rtol=0, atol=1e-5)
        with actor.module.disable_adapter():
            base = actor.module(input_ids=ids).logits
    assert (adapter - base).abs().max() > 1e-3                             # the export is not the base model


@needs_peft
@pytest.mark.parametrize("override, needles", [
    ("model.lora.target_modules=[q_proj,qkv]", ["model.lora.target_modules",
                                                "'qkv' matches no linear or embedding layer",
                                                "valid choices: all-linear, down_proj, embed_tokens, gate_proj, k_proj, "
                                                "o_proj, q_proj, up_proj, v_proj"]),
    ("model.lora.rank=0", ["'model.lora.rank': 0 is not an integer >= 1"]),
    ("model.lora.target_modules=q_proj", ['must be "all-linear" or a non-empty list']),
    ("worker.name=debug", ["model.lora.enable = true, but worker.name = 'debug' cannot train a LoRA adapter",
                           "valid choices: ", "hf"]),
])
def test_bad_lora_input_exits_2_with_one_line_naming_the_key(override, needles, tmp_path):
    proc = train("--config", "examples/configs/tiny_grpo.toml", NO_GRPO, *QUIET, "model.lora.enable=true", override,
                 "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(n in errors[0] for n in needles), errors


def test_lora_without_peft_exits_2_with_the_install_line(tmp_path):
    """Runs everywhere: where peft is installed, the subprocess blocks its import (sys.modules entry None)."""
    code = ("import sys; sys.modules['peft'] = None; from nanoverl_core.cli import main; sys.exit(main())"
            if HAS_PEFT else "from nanoverl_core.cli import main; import sys; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", code, "--config", "examples/configs/tiny_grpo.toml", NO_GRPO, *QUIET,
                           "model.lora.enable=true", "trainer.total_steps=1", f"trainer.output_dir={tmp_path / 'r'}"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]  # from a source checkout the line adds its pip install -e form
    assert errors[0].startswith('error: model.lora.enable = true needs peft, which is not installed: '
                                'pip install "nanoverl[lora]"'), errors
    assert errors[0].endswith("(or set model.lora.enable = false)"), errors
