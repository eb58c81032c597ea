"""model.compute_dtype: bf16 autocast over float32 weights, gradients and AdamW state (mixed precision)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from nanoverl_core import load_config, load_registry
from nanoverl_core.algos import logprobs_from_hidden
from nanoverl_core.errors import ConfigError


def _config(tmp_path, *extra: str):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "12="}\n')
    return load_config(None, [f"data.train_files=[{data}]", *extra], registry=load_registry())


@pytest.mark.parametrize("dtype, compute", [("float32", ""), ("float32", "bfloat16"), ("float32", "float16"),
                                            ("bfloat16", "bfloat16"), ("bfloat16", "")])
def test_a_compute_dtype_at_or_below_the_weights_is_accepted(tmp_path, dtype, compute):
    cfg = _config(tmp_path, f"model.dtype={dtype}", f"model.compute_dtype={compute}")
    assert (cfg.model.dtype, cfg.model.compute_dtype) == (dtype, compute)


@pytest.mark.parametrize("dtype, compute", [("bfloat16", "float32"), ("bfloat16", "float16"), ("float16", "bfloat16")])
def test_a_compute_dtype_other_than_narrower_weights_is_a_config_error(tmp_path, dtype, compute):
    with pytest.raises(ConfigError, match=f"model.compute_dtype = '{compute}' with model.dtype = '{dtype}'"):
        _config(tmp_path, f"model.dtype={dtype}", f"model.compute_dtype={compute}")


@pytest.mark.parametrize("fast", [True, False])
def test_a_cpu_that_emulates_the_compute_dtype_is_warned_about_once(tmp_path, monkeypatch, capsys, fast):
    """Without bf16 matmul instructions (an AVX2-only CPU) a bf16 matmul ran ~40x slower than float32 here:
    one warning line for the whole process (actor, reference and critic are built), none when it is fast
    or compute_dtype is unset."""
    from nanoverl_core.builtins.debug import make_workers
    from nanoverl_core.workers import precision

    monkeypatch.setattr(precision, "cpu_has_fast", lambda dtype: fast)
    precision.warn_slow_compute_dtype.cache_clear()
    for compute in ("", "bfloat16", "bfloat16"):
        make_workers(_config(tmp_path, f"model.compute_dtype={compute}", "trainer.device=cpu", "reference.enable=true",
                             "critic.enable=true"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: model.compute_dtype")]
    assert len(warnings) == (0 if fast else 1) and all("'bfloat16'" in w for w in warnings)


def test_the_chunked_heads_backward_recomputes_the_logits_under_the_forwards_autocast():
    """Several chunks recompute their logits in backward, one chunk keeps the forward's: under bf16 autocast
    both must be the bf16 product, so the gradients agree to float32 rounding (a backward recomputing in
    float32 differs from the kept chunk by bf16 rounding, ~1e-3 here)."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(12, 16, generator=g), torch.randn(40, 16, generator=g) / 4
    labels = torch.randint(0, 40, (12,), generator=g)

    def grads(chunk):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            log_probs, entropy = logprobs_from_hidden(h, w, labels, with_entropy=True, chunk_size=chunk)
        (log_probs.sum() + entropy.sum()).backward()
        return h.grad, w.grad

    (h_one, w_one), (h_split, w_split) = grads(12), grads(5)
    torch.testing.assert_close(h_split, h_one, rtol=0, atol=1e-5)
    torch.testing.assert_close(w_split, w_one, rtol=0, atol=1e-5)


def test_on_cpu_a_differentiated_pass_runs_its_attention_in_float32():
    """bf16's flash-attention backward is ~3x slower than float32's on CPU: under the worker's autocast a
    pass entered with gradients runs scaled_dot_product_attention in float32 (output and input gradients
    those of float32 attention, the output cast to bf16 as autocast makes it); a no-grad pass, and a model
    whose blocks gradient checkpointing recomputes in backward, keep autocast's bf16 kernel."""
    import torch.nn.functional as F

    from nanoverl_core.config.schema import ModelConfig
    from nanoverl_core.workers import autocast

    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 3, 7, 8, generator=g) for _ in range(3)]
    weight = torch.randn(2, 3, 7, 8, generator=g).bfloat16().float()        # a gradient bf16 holds exactly
    cpu = torch.device("cpu")

    def attend(context, grad=True):
        leaves = [t.clone().requires_grad_(grad) for t in qkv]
        with torch.set_grad_enabled(grad), context:
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        if grad:
            (out.float() * weight).sum().backward()
        return out, [t.grad for t in leaves]

    float32, float32_grads = attend(contextlib.nullcontext())
    bf16, bf16_grads = attend(torch.autocast("cpu", dtype=torch.bfloat16))
    out, grads = attend(autocast(ModelConfig(compute_dtype="bfloat16"), cpu))
    assert out.dtype == torch.bfloat16 and torch.equal(out, float32.to(torch.bfloat16)) and not torch.equal(out, bf16)
    for got, want, emulated in zip(grads, float32_grads, bf16_grads):
        assert torch.equal(got, want) and not torch.equal(emulated, want)
    for context, grad in ((autocast(ModelConfig(compute_dtype="bfloat16"), cpu), False),
                          (autocast(ModelConfig(compute_dtype="bfloat16", gradient_checkpointing=True), cpu), True)):
        assert torch.equal(attend(context, grad)[0], bf16)


# ---- a real TorchActor / TorchCritic on a tiny transformers Llama -----------------------------------

def _workers(tmp_path, *extra: str):
    pytest.importorskip("nanoverl_hf")
    from nanoverl_hf.tiny import build_tiny_model
    from nanoverl_hf.workers import make_workers

    model = tmp_path / "model"
    if not model.exists():
        build_tiny_model(model, alphabet="0123456789=abcdefghijklmnopqrstuvwxyz")   # 40 tokens
    return make_workers(_config(tmp_path, f"model.path={model}", "worker.name=hf", "rollout.name=hf",
                                "trainer.device=cpu", "data.batch_size=4", "rollout.temperature=0.7", "actor.lr=1e-3",
                                "actor.entropy_coeff=0.05", "actor.micro_batch_size=2", "reference.enable=true",
                                "critic.enable=true", "algorithm.advantage_estimator=gae", *extra))


def _batch(tokenizer):
    """8 rows: 4 prompts of 1-4 tokens, each twice (so the prompt cache serves them), responses of 1-6 tokens."""
    from nanoverl_core.testing import prompt_batch, with_loss_mask

    batch = prompt_batch(tokenizer, ["12=", "9876=", "5=", "abc="] * 2)
    g = torch.Generator().manual_seed(0)
    batch["responses"] = torch.randint(3, 40, (8, 6), generator=g)
    batch["response_mask"] = (torch.arange(6)[None] < torch.tensor([6, 2, 1, 4, 3, 5, 6, 2])[:, None]).float()
    batch["advantages"] = torch.randn(8, 6, generator=g) * batch["response_mask"]
    batch["returns"] = torch.randn(8, 6, generator=g) * batch["response_mask"]
    with_loss_mask(batch)
    return batch


def _passes(workers):
    """Log-probs, values, the parameters before and after one actor and one critic update, the AdamW state."""
    from nanoverl_core.algos import vanilla

    actor, critic = workers.actor, workers.critic
    batch = _batch(workers.tokenizer)
    batch["old_log_probs"] = actor.compute_log_probs(batch)
    batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
    batch["values"] = critic.compute_values(batch)
    before = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
    actor.update(batch, vanilla)
    critic.update(batch)
    after = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
    return batch, before, after


def _linear_calls(workers) -> list[tuple[bool, torch.dtype]]:
    """(autocast on, output dtype) of every nn.Linear call of the actor, reference and critic from now on."""
    calls = []

    def hook(module, args, output):
        calls.append((torch.is_autocast_enabled("cpu"), output.dtype))
    for worker in (workers.actor, workers.reference, workers.critic):
        for sub in worker.module.modules():
            if isinstance(sub, torch.nn.Linear):
                sub.register_forward_hook(hook)
    return calls


@pytest.mark.hf
@pytest.mark.parametrize("chunk, checkpointing", [(0, False), (3, False), (3, True)],
                         ids=["full_logits", "chunked_head", "gradient_checkpointing"])
def test_every_forward_runs_under_the_compute_dtype_and_only_then(tmp_path, chunk, checkpointing):
    """compute_dtype "" enters no autocast anywhere (today's float32 numbers, bit for bit: the code path is
    the one before compute_dtype existed); "bfloat16" runs every linear layer of every pass in bf16: the
    log-prob, reference and value passes and both updates, through the prompt cache (rows repeat) and the
    chunked LM head or the full logits; with gradient checkpointing the blocks recomputed in backward too.
    Only the prompt cache's one-time check (each worker's first pass) compares float32 outputs, autocast off."""
    for compute, want in (("", {(False, torch.float32)}), ("bfloat16", {(True, torch.bfloat16)})):
        workers = _workers(tmp_path, f"model.compute_dtype={compute}", f"actor.logits_chunk_size={chunk}",
                           f"model.gradient_checkpointing={str(checkpointing).lower()}")
        calls = _linear_calls(workers)
        _passes(workers)
        assert set(calls) <= want | {(False, torch.float32)}                # the checks, once
        calls.clear()
        _passes(workers)
        # the shared prompt cache stayed on (a checkpointed training pass runs plain; the log-prob passes use it)
        assert workers.actor.forward_pass.cache_keyword is not None
        assert (workers.actor.forward_pass.head is not None) == (chunk > 0)
        assert len(calls) > 100 and set(calls) == want


@pytest.mark.hf
@pytest.mark.parametrize("chunk", [0, 3], ids=["full_logits", "chunked_head"])
def test_bf16_mixed_precision_agrees_with_float32_and_keeps_float32_state(tmp_path, chunk):
    """Same seed, same weights: bf16 autocast gives the float32 log-probs and values to bf16 rounding
    (max |diff| measured on this tiny Llama, both head paths: 1.8e-3 log-probs, 1.6e-3 values; bounds
    1.5e-2 and 8e-3), its update moves the weights in the float32 update's direction (cosine of the
    parameter deltas measured 0.998; bound 0.9), and weights, AdamW state and the checkpoint stay float32."""
    fp32, bf16 = (_workers(tmp_path, f"model.compute_dtype={c}", f"actor.logits_chunk_size={chunk}")
                  for c in ("", "bfloat16"))
    (b32, before32, after32), (b16, before16, after16) = _passes(fp32), _passes(bf16)
    assert all(torch.equal(before32[n], before16[n]) for n in before32)           # the same starting weights
    mask = b32["response_mask"] == 1
    lp_diff = (b32["old_log_probs"] - b16["old_log_probs"])[mask].abs().max()
    value_diff = (b32["values"] - b16["values"])[mask].abs().max()
    assert 0 < lp_diff < 1.5e-2 and 0 < value_diff < 8e-3, (lp_diff, value_diff)   # 0: no bf16 was run at all
    assert b16["old_log_probs"].dtype == b16["values"].dtype == torch.float32
    for worker in (bf16.actor, bf16.critic):
        assert {p.dtype for p in worker.module.parameters()} == {torch.float32}
        state = worker.optimizer.state.values()
        assert len(state) > 0 and {s[k].dtype for s in state for k in ("exp_avg", "exp_avg_sq")} == {torch.float32}
    delta32 = torch.cat([(after32[n] - before32[n]).flatten() for n in after32])
    delta16 = torch.cat([(after16[n] - before16[n]).flatten() for n in after16])
    cosine = torch.nn.functional.cosine_similarity(delta32, delta16, dim=0)
    assert delta16.abs().max() > 5e-4 and cosine > 0.9, cosine
    bf16.actor.save(tmp_path / "ckpt")
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}


@pytest.mark.hf
def test_each_weight_is_cast_once_per_pass_not_once_per_micro_batch(tmp_path):
    """8 rows in micro-batches of 2: a log-prob pass casts every trainable weight to bf16 once (`casts_once`:
    autocast's cast kept over the micro-batches), not 4 times as one autocast per micro-batch does, and an
    update (2 mini-batches of 2 micro-batches) once per optimizer step, 2 times instead of 4; log-probs,
    values and the updated weights are bitwise those of casting per micro-batch. A frozen reference keeps
    no casts (autocast keeps only those of weights that require gradients)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class WeightCasts(TorchDispatchMode):
        def __init__(self, weights):
            super().__init__()
            self.weights, self.count = {w.data_ptr() for w in weights}, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.weights:
                self.count += 1
            return func(*args, **(kwargs or {}))

    results = {}
    for once in (True, False):
        workers = _workers(tmp_path, "model.compute_dtype=bfloat16")
        _passes(workers)                                             # the first passes' one-time checks
        for worker in (workers.actor, workers.critic):
            assert worker.forward_pass.keeps_casts and not workers.reference.forward_pass.keeps_casts
            worker.forward_pass.keeps_casts = once
        batch = _batch(workers.tokenizer)
        matmul_weights = [m.weight for m in workers.actor.module.modules() if isinstance(m, torch.nn.Linear)]
        with WeightCasts(matmul_weights) as casts:
            batch["old_log_probs"] = workers.actor.compute_log_probs(batch)
        assert casts.count == len(matmul_weights) * (1 if once else 4), casts.count
        batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
        batch["values"] = workers.critic.compute_values(batch)
        from nanoverl_core.algos import vanilla
        assert [len(micro) for micro, _ in workers.actor.minibatches(batch)] == [2, 2]
        with WeightCasts(matmul_weights) as casts:
            workers.actor.update(batch, vanilla)
        # casting per micro-batch, the chunked head's backward casts the head once more for each
        assert casts.count == 2 * len(matmul_weights) if once else casts.count >= 4 * len(matmul_weights)
        workers.critic.update(batch)
        results[once] = (batch, {n: p.detach().clone() for w in (workers.actor, workers.critic)
                                 for n, p in w.module.named_parameters()})
    (kept, kept_weights), (each, each_weights) = results[True], results[False]
    for key in ("old_log_probs", "ref_log_probs", "values"):
        assert torch.equal(kept[key], each[key]), key
    assert kept_weights.keys() == each_weights.keys()
    assert all(torch.equal(kept_weights[n], each_weights[n]) for n in kept_weights)
