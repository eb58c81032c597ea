"""Log-probs and entropy through the LM head in chunks of positions (`logprobs_from_hidden`, the actor's
`actor.logits_chunk_size`) equal the full-logits path in values and gradients, never hold the whole
(positions, vocabulary) logits, and give the same update on a real transformers model, falling back to
the full logits where the head cannot be split off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from nanoverl_core.algos import entropy_from_logits, logprobs_from_hidden, logprobs_from_logits
from nanoverl_core.workers import ChunkedHead

B, R, H, V = 3, 9, 16, 300


def plain(hidden, weight, labels, bias=None, temperature=1.0):
    """What the actor computed before: the full (N, V) logits, then logprobs_ / entropy_from_logits
    (which compute in float32; float64 inputs get the same formulas in float64 through torch's log_softmax)."""
    logits = F.linear(hidden, weight, bias)
    if logits.dtype == torch.float64:
        logp = torch.log_softmax(logits / temperature, dim=-1)
        return logp.gather(-1, labels[:, None])[:, 0], -(logp.exp() * logp).sum(-1)
    logits = logits.float() / temperature
    return logprobs_from_logits(logits[None], labels[None])[0], entropy_from_logits(logits[None])[0]


def inputs(dtype=torch.float32, seed=0, bias=True):
    """hidden (B, R, H), a response mask (B, R) with padding, labels (B, R), weight (V, H), bias (V,)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, R, H, generator=g, dtype=dtype).requires_grad_()
    lengths = torch.tensor([R, 4, 1])
    mask = torch.arange(R)[None] < lengths[:, None]
    labels = torch.randint(0, V, (B, R), generator=g)
    weight = (torch.randn(V, H, generator=g, dtype=dtype) * 0.5).requires_grad_()
    b = (torch.randn(V, generator=g, dtype=dtype) * 0.1).requires_grad_() if bias else None
    return hidden, mask, labels, weight, b


def values_and_grads(fn, hidden, mask, labels, weight, bias, with_entropy=True):
    """(log_probs, entropy) at the valid positions, and the gradients of a random mix of both."""
    lp, ent = fn(hidden[mask], weight, labels[mask], bias)
    g = torch.Generator().manual_seed(1)
    loss = (torch.randn(lp.shape, generator=g, dtype=lp.dtype) * lp).sum()
    if with_entropy:
        loss = loss + (torch.randn(ent.shape, generator=g, dtype=ent.dtype) * ent).sum()
    params = [hidden, weight] + ([bias] if bias is not None else [])
    grads = torch.autograd.grad(loss, params)
    return lp.detach(), (ent.detach() if with_entropy else None), grads


def assert_grads_close(got, want, tol):
    """Gradients to `tol` relative to each one's largest entry: in float32 both paths are ~3e-6 (relative to
    that entry) from the float64 gradient, summing V terms per entry in different orders."""
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=tol * float(w.abs().max()))


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])          # 14 valid positions: divides, does not, one chunk
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_values_and_gradients_equal_the_full_logits_path(chunk, temperature, bias, dtype):
    # float32: the two paths sum V = 300 terms in different orders; the largest difference seen over thread
    # counts and kernel ISAs was 0.83e-5, so 3e-5 (float64 stays at 1e-12)
    tol = 3e-5 if dtype == torch.float32 else 1e-12
    hidden, mask, labels, weight, b = inputs(dtype, bias=bias)
    want = values_and_grads(lambda h, w, y, b: plain(h, w, y, b, temperature), hidden, mask, labels, weight, b)
    got = values_and_grads(lambda h, w, y, b: logprobs_from_hidden(h, w, y, b, temperature=temperature,
                                                                  with_entropy=True, chunk_size=chunk),
                           hidden, mask, labels, weight, b)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=tol)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=tol)
    assert_grads_close(got[2], want[2], tol)
    assert want[2][0][~mask].abs().max() == 0 and want[2][0][mask].abs().max() > 0.1   # padding gets no gradient


def test_without_entropy_the_log_prob_gradient_is_unchanged():
    hidden, mask, labels, weight, b = inputs()
    want = values_and_grads(lambda h, w, y, b: plain(h, w, y, b, 0.5), hidden, mask, labels, weight, b, False)
    assert logprobs_from_hidden(hidden[mask], weight, labels[mask], b, temperature=0.5, chunk_size=5)[1] is None
    got = values_and_grads(lambda h, w, y, b: logprobs_from_hidden(h, w, y, b, temperature=0.5, chunk_size=5),
                           hidden, mask, labels, weight, b, False)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
    assert_grads_close(got[2], want[2], 1e-5)


def test_gradcheck_in_float64():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 6, 3, 3, 1])
    for with_entropy in (True, False):
        def fn(h, w, b, with_entropy=with_entropy):
            lp, ent = logprobs_from_hidden(h, w, labels, b, temperature=0.7, with_entropy=with_entropy, chunk_size=2)
            return (lp, ent) if with_entropy else lp
        assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


@pytest.mark.parametrize("chunk", [3, 64])                 # recomputed in backward; one chunk, kept from forward
def test_a_second_backward_through_a_retained_graph_gives_the_same_gradient(chunk):
    hidden, mask, labels, weight, b = inputs()
    lp, ent = logprobs_from_hidden(hidden[mask], weight, labels[mask], b, temperature=0.7, with_entropy=True,
                                   chunk_size=chunk)
    loss = lp.sum() + 0.3 * ent.sum()
    first = torch.autograd.grad(loss, [hidden, weight], retain_graph=True)
    second = torch.autograd.grad(loss, [hidden, weight])
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_no_positions_give_zero_gradients():
    """The weight's gradient is accumulated into an uninitialised tensor that the first chunk overwrites: with
    no position at all (a micro-batch of no response token) there is no chunk, and the gradient is zero."""
    weight = torch.randn(40, 16, requires_grad=True)
    hidden = torch.randn(0, 16, requires_grad=True)
    lp, ent = logprobs_from_hidden(hidden, weight, torch.zeros(0, dtype=torch.long), with_entropy=True, chunk_size=4)
    (lp.sum() + ent.sum() + (weight * 0).sum()).backward()
    assert lp.shape == ent.shape == (0,) and torch.equal(weight.grad, torch.zeros_like(weight))


def test_bfloat16_inputs_give_float32_results_equal_to_the_full_logits_path():
    """The head's product runs in bf16, as the model's own nn.Linear does (so no float32 copy of the
    weight); everything after it in float32. Dyadic inputs make every bf16 product exact, so any split of
    the matmul gives the same logits and the comparison can be tight."""
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randint(-4, 5, (B, R, H), generator=g) / 8).bfloat16().requires_grad_()
    weight = (torch.randint(-4, 5, (V, H), generator=g) / 8).bfloat16().requires_grad_()
    _, mask, labels, _, _ = inputs()
    want = values_and_grads(lambda h, w, y, b: plain(h, w, y, None, 0.7), hidden, mask, labels, weight, None)
    got = values_and_grads(lambda h, w, y, b: logprobs_from_hidden(h, w, y, temperature=0.7, with_entropy=True,
                                                                  chunk_size=3), hidden, mask, labels, weight, None)
    assert got[0].dtype == got[1].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-5)
    assert got[2][0].dtype == got[2][1].dtype == torch.bfloat16
    for g_, w in zip(got[2], want[2]):   # bf16 gradients: the plain path rounds one big product, we sum chunks in fp32
        torch.testing.assert_close(g_.float(), w.float(), rtol=1e-2, atol=1e-3)


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op creates (forward and backward) while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.largest = max([self.largest] + [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out


def test_no_tensor_of_positions_times_vocabulary_is_ever_made():
    n, chunk, h, v = 64, 8, 16, 500                          # chunk * v = 4,000 < v * h = 8,000 < n * v = 32,000
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    sizes = {}
    for name, fn in (("plain", lambda: plain(hidden, weight, labels)),
                     ("chunked", lambda: logprobs_from_hidden(hidden, weight, labels, with_entropy=True,
                                                              chunk_size=chunk))):
        with LargestTensor() as mode:
            lp, ent = fn()
            (lp.sum() + ent.sum()).backward()
        sizes[name] = mode.largest
    assert sizes["plain"] == n * v                            # the test sees the full logits when they exist
    assert sizes["chunked"] == v * h                          # the weight's gradient; chunks are 8 x 500


def test_a_module_without_a_plain_linear_head_is_not_chunked():
    from nanoverl_core.builtins.debug import TinyCausalLM

    assert ChunkedHead.of(TinyCausalLM(vocab_size=12, hidden=8, layers=1, heads=2), 1024) is None
    linear = torch.nn.Linear(4, 6, bias=False)
    module = torch.nn.Module()
    module.get_output_embeddings = lambda: linear
    assert ChunkedHead.of(module, 1024) is not None and ChunkedHead.of(module, 0) is None   # 0 = off


def test_a_negative_chunk_size_is_a_config_error_naming_the_key():
    from conftest import EXAMPLES
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.errors import ConfigError

    assert load_config(EXAMPLES / "debug_ppo.toml", registry=load_registry()).actor.logits_chunk_size == 1024
    with pytest.raises(ConfigError, match="'actor.logits_chunk_size': -1 is not an integer >= 0"):
        load_config(EXAMPLES / "debug_ppo.toml", ["actor.logits_chunk_size=-1"], registry=load_registry())


# ---- a real TorchActor on a tiny transformers Llama ------------------------------------------------

def _workers(tmp_path, chunk: int, *extra: str):
    pytest.importorskip("nanoverl_hf")
    from nanoverl_core import load_config, load_registry
    from nanoverl_hf.tiny import build_tiny_model
    from nanoverl_hf.workers import make_workers

    model = tmp_path / "model"
    if not model.exists():
        build_tiny_model(model, alphabet="0123456789=abcdefghijklmnopqrstuvwxyz")   # 40 tokens
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "12="}\n')
    cfg = load_config(None, [f"data.train_files=[{data}]", f"model.path={model}", "worker.name=hf",
                             "rollout.name=hf", "trainer.device=cpu", "data.batch_size=4", "rollout.temperature=0.7",
                             "actor.lr=1e-3", "actor.entropy_coeff=0.05", "actor.micro_batch_size=2",
                             f"actor.logits_chunk_size={chunk}", "reference.enable=true",
                             # the head alone: prompt sharing with chunking is pinned in nanoverl-hf's test_share_prompts
                             "actor.share_prompts=false", *extra], registry=load_registry())
    return make_workers(cfg)


def _batch(tokenizer):
    """4 rows, prompts of 1-4 tokens, responses of 1-6 tokens (padding on both sides), random advantages."""
    from nanoverl_core.testing import prompt_batch, with_loss_mask

    batch = prompt_batch(tokenizer, ["12=", "9876=", "5=", "abc="])
    lengths = [6, 2, 1, 4]
    g = torch.Generator().manual_seed(0)
    batch["responses"] = torch.randint(3, 40, (4, 6), generator=g)
    batch["response_mask"] = (torch.arange(6)[None] < torch.tensor(lengths)[:, None]).float()
    batch["advantages"] = torch.randn(4, 6, generator=g) * batch["response_mask"]
    with_loss_mask(batch)                                          # every sampled token counts
    return batch


def _one_update(workers):
    """The batch with old / reference log-probs, the update's metrics, its gradients, the parameters after it."""
    from nanoverl_core.algos import vanilla

    actor, grads = workers.actor, {}
    batch = _batch(workers.tokenizer)
    batch["old_log_probs"] = actor.compute_log_probs(batch)
    batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
    step = actor.clip_and_step

    def recording(nonfinite):
        grads.update({n: p.grad.clone() for n, p in actor.module.named_parameters() if p.grad is not None})
        return step(nonfinite)
    actor.clip_and_step = recording
    metrics = actor.update(batch, vanilla)
    params = {n: p.detach().clone() for n, p in actor.module.named_parameters() if p.requires_grad}
    return batch, metrics, grads, params


def assert_same_update(got, want):
    """Same log-probs and metrics; the optimizer's inputs (gradients) everywhere and its outputs (parameters
    after the AdamW step) where the step is well conditioned (`assert_same_adam_step`: at lr 1e-3, Adam's
    first step lr * g / (|g| + eps) turns the ~1e-10 rounding of a ~1e-8 gradient into ~1e-6, more or less
    with the thread count)."""
    from nanoverl_core.testing import assert_same_adam_step

    (c_batch, c_metrics, c_grads, c_params), (p_batch, p_metrics, p_grads, p_params) = got, want
    mask = p_batch["response_mask"]
    for key in ("old_log_probs", "ref_log_probs"):
        torch.testing.assert_close(c_batch[key] * mask, p_batch[key] * mask, rtol=0, atol=1e-6)
    assert c_metrics.keys() == p_metrics.keys() and "actor/entropy" in c_metrics
    for key in p_metrics:
        assert c_metrics[key] == pytest.approx(p_metrics[key], rel=1e-5, abs=1e-6), key
    assert c_grads.keys() == p_grads.keys() == p_params.keys()
    assert_same_adam_step(c_params, p_params, c_grads, p_grads)


@pytest.mark.hf
@pytest.mark.parametrize("extra", [[], ["actor.use_kl_loss=true", "actor.max_tokens_per_micro_batch=12",
                                        "actor.micro_batch_size=0"], ["model.gradient_checkpointing=true"]],
                         ids=["micro_batches", "kl_token_budget", "gradient_checkpointing"])
def test_a_tiny_llama_update_is_the_same_with_and_without_chunking(tmp_path, extra):
    plain_w, chunked_w = _workers(tmp_path, 0, *extra), _workers(tmp_path, 3, *extra)   # 3: splits 13 positions
    assert plain_w.actor.forward_pass.head is None and chunked_w.actor.forward_pass.head is not None
    assert chunked_w.reference.forward_pass.head is not None
    want, got = _one_update(plain_w), _one_update(chunked_w)
    assert chunked_w.actor.forward_pass.head.checked                # still on after its first call
    assert_same_update(got, want)
    initial = _workers(tmp_path / "init", 0, *extra).actor.module.state_dict()
    assert max((want[3][n] - initial[n]).abs().max() for n in want[3]) > 5e-4    # the step moved the weights


@pytest.mark.hf
def test_a_model_that_transforms_its_logits_falls_back_to_the_full_logits(tmp_path):
    """A soft-capped or scaled head (Gemma-2 style) is not a plain product: the first call sees the
    mismatch, and the actor gives the full-logits path's numbers from then on."""
    def soft_cap(module, args, output):
        output.logits = 2.0 * torch.tanh(output.logits / 2.0)
        return output
    plain_w, chunked_w = _workers(tmp_path, 0), _workers(tmp_path, 4)
    for w in (plain_w, chunked_w):
        w.actor.module.register_forward_hook(soft_cap)
    batch = _batch(plain_w.tokenizer)
    want = plain_w.actor.compute_log_probs(batch)
    got = chunked_w.actor.compute_log_probs(batch)
    assert chunked_w.actor.forward_pass.head is None
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    with torch.no_grad():
        (lp, ent), (_, want_ent) = chunked_w.actor.forward(batch, True), plain_w.actor.forward(batch, True)
    torch.testing.assert_close(lp * batch["response_mask"], want, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=1e-6)


@pytest.mark.hf
def test_the_sum_pi_squared_pass_gives_the_chunked_heads_log_probs(tmp_path):
    """compute_log_probs_and_sum_pi_squared (full logits, for the optimal token baseline) and the chunked
    compute_log_probs give the same log-probs on a transformers model (logits_to_keep, temperature 0.7)."""
    workers = _workers(tmp_path, 4)
    batch = _batch(workers.tokenizer)
    log_probs, sum_sq = workers.actor.compute_log_probs_and_sum_pi_squared(batch)
    torch.testing.assert_close(log_probs, workers.actor.compute_log_probs(batch), rtol=0, atol=1e-5)
    assert workers.actor.forward_pass.head is not None                   # the chunked path served the second call
    valid = batch["response_mask"] == 1
    assert (sum_sq[valid] >= log_probs.exp()[valid] ** 2 - 1e-6).all() and (sum_sq[valid] <= 1).all()
    assert (sum_sq[~valid] == 0).all()
