"""actor.share_prompts / critic.share_prompts: each distinct prompt of a micro-batch runs once through a
transformers model and its KV cache serves every row that repeats it. Log-probs, entropy, values,
gradients and a whole update equal the plain pass's (every row its whole sequence); the prompt's
tokens are fed once; a model that drops the cache is caught before its first cached pass."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import prompt_batch, with_responses

from nanoverl_core.algos import vanilla
from nanoverl_core.testing import assert_same_adam_step, with_loss_mask
from nanoverl_hf.workers import make_workers

N = 3                                     # samples per prompt
PROMPTS = ["12=", "9876=", "5="]          # three lengths: left padding differs between the groups
PLAIN = ["actor.share_prompts=false"]


def grpo_batch(tok, seed: int = 0):
    """Every prompt repeated N times (rows of a group adjacent, as the trainer lays them out), responses of
    different lengths, old log-probs and advantages: what an update receives."""
    gen = torch.Generator().manual_seed(seed)
    responses = [torch.randint(3, 12, (int(torch.randint(1, 6, (), generator=gen)),), generator=gen).tolist()
                 for _ in range(len(PROMPTS) * N)]
    batch = with_responses(prompt_batch(tok, [p for p in PROMPTS for _ in range(N)]), responses, tok.pad_token_id)
    batch["advantages"] = torch.randn(batch["response_mask"].shape, generator=gen) * batch["response_mask"]
    with_loss_mask(batch)                                          # every sampled token counts
    batch["returns"] = torch.randn(batch["response_mask"].shape, generator=gen) * batch["response_mask"]
    return batch


def tokens_fed(module) -> list[tuple[int, int]]:
    """A list that records the (rows, positions) of every forward of module's embedding from now on."""
    shapes: list[tuple[int, int]] = []
    module.get_input_embeddings().register_forward_pre_hook(lambda _, args: shapes.append(tuple(args[0].shape)))
    return shapes


@pytest.mark.parametrize("chunk", [0, 4])
def test_log_probs_entropy_gradients_and_an_update_equal_the_plain_pass(tiny_dir, make_config, chunk):
    runs = []
    for plain in (True, False):
        cfg = make_config(tiny_dir, "actor.lr=1e-2", "actor.entropy_coeff=0.1", "rollout.temperature=0.7",
                          f"rollout.n={N}", "data.batch_size=3", f"actor.logits_chunk_size={chunk}",
                          "actor.pack=false", *(PLAIN if plain else []))
        workers = make_workers(cfg)
        actor, batch = workers.actor, grpo_batch(workers.tokenizer)
        assert (actor.forward_pass.cache_keyword is None) == plain
        fed = tokens_fed(actor.module)
        with torch.no_grad():
            log_probs, entropy = actor.forward(batch, with_entropy=True)
        prompt, response = batch["prompts"].shape[1], int(batch["response_mask"].sum(-1).max())
        if plain:
            assert fed[-1] == (9, prompt + response)
        else:   # after the check on two rows (3 forwards): 3 distinct prompts but their last token, once;
            # then every row from its prompt's last token on (the chunked head checks itself in between)
            assert fed[3] == (3, prompt - 1) and fed[-1] == (9, 1 + response)
        batch["old_log_probs"] = actor.compute_log_probs(batch)
        grads = []
        step = actor.clip_and_step

        def recording(nonfinite, actor=actor, step=step, grads=grads):
            grads.append({n: p.grad.clone() for n, p in actor.module.named_parameters()})
            return step(nonfinite)
        actor.clip_and_step = recording
        metrics = actor.update(batch, vanilla)
        runs.append((log_probs, entropy, batch["old_log_probs"], grads[0], metrics,
                     {n: p.detach().clone() for n, p in actor.module.named_parameters()}))
    (lp0, ent0, old0, g0, m0, p0), (lp1, ent1, old1, g1, m1, p1) = runs
    mask = old0 != 0                                   # the response tokens
    assert mask.sum() > 9
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1[mask], ent0[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(old1, old0, rtol=0, atol=1e-5)
    assert m0.keys() == m1.keys()
    for key in m0:
        assert m1[key] == pytest.approx(m0[key], rel=1e-4, abs=1e-6), key
    # gradients everywhere, parameters where Adam's step is well conditioned (see its docstring)
    assert_same_adam_step(p1, p0, g1, g0, grad_rtol=1e-4)


def test_values_and_the_critic_update_equal_the_plain_pass(tiny_dir, make_config):
    runs = []
    for plain in (True, False):
        workers = make_workers(make_config(tiny_dir, "critic.enable=true", "critic.lr=1e-2", f"rollout.n={N}",
                                           "data.batch_size=3", *(["critic.share_prompts=false"] if plain else [])))
        critic = workers.critic
        assert (critic.forward_pass.cache_keyword is None) == plain
        batch = grpo_batch(workers.tokenizer)
        batch["values"] = critic.compute_values(batch)
        critic.update(batch)
        runs.append((batch["values"], critic.compute_values(batch)))
    (v0, after0), (v1, after1) = runs
    torch.testing.assert_close(v1, v0, rtol=0, atol=1e-5)
    torch.testing.assert_close(after1, after0, rtol=0, atol=1e-5)
    assert (after0 - v0).abs().max() > 1e-3            # the update moved the values


def test_gradient_checkpointing_trains_plain_and_still_shares_no_grad_passes(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "model.gradient_checkpointing=true", f"rollout.n={N}", "data.batch_size=3",
                      "actor.pack=false")
    workers = make_workers(cfg)
    actor, batch = workers.actor, grpo_batch(workers.tokenizer)
    batch["old_log_probs"] = actor.compute_log_probs(batch)      # no grad: through the cache
    fed = tokens_fed(actor.module)
    actor.update(batch, vanilla)
    width = batch["prompts"].shape[1] + int(batch["response_mask"].sum(-1).max())
    assert fed[:1] == [(9, width)]                      # checkpointed blocks drop caches: each row whole


def test_a_model_that_drops_the_cache_is_caught_and_runs_plain(tiny_dir, make_config, capsys):
    workers = make_workers(make_config(tiny_dir, f"rollout.n={N}", "data.batch_size=3", "actor.pack=false"))
    actor = workers.actor
    forward = actor.module.forward

    def forgetful(*args, **kwargs):                     # ignores the cache it is given, makes a fresh one
        kwargs.pop(actor.forward_pass.cache_keyword, None)
        return forward(*args, **kwargs)
    batch = grpo_batch(workers.tokenizer)
    want = make_workers(make_config(tiny_dir, *PLAIN, f"rollout.n={N}", "data.batch_size=3")).actor \
        .compute_log_probs(batch)
    actor.module.forward = forgetful
    got = actor.compute_log_probs(batch)
    assert actor.forward_pass.cache_keyword is None
    assert "actor.share_prompts is off for this run" in capsys.readouterr().err
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft (pip install 'nanoverl-hf[lora]')")
def test_lora_actor_and_its_adapter_off_reference_share_prompts(tiny_dir, make_config):
    lora = ["model.lora.enable=true", "model.lora.rank=4", "model.lora.alpha=8", "reference.enable=true",
            "actor.lr=1e-2", f"rollout.n={N}", "data.batch_size=3"]
    runs = []
    for plain in (True, False):
        workers = make_workers(make_config(tiny_dir, *lora, *(PLAIN if plain else [])))
        keywords = workers.actor.forward_pass.cache_keyword, workers.reference.forward_pass.cache_keyword
        assert (keywords[0] is None) == plain == (keywords[1] is None)
        batch = grpo_batch(workers.tokenizer)
        batch["old_log_probs"] = workers.actor.compute_log_probs(batch)
        workers.actor.update(batch, vanilla)
        workers.actor.update(batch, vanilla)           # lora_B starts at 0: the second step moves the policy
        runs.append((workers.actor.compute_log_probs(batch), workers.reference.compute_log_probs(batch)))
    (lp0, ref0), (lp1, ref1) = runs
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(ref1, ref0, rtol=0, atol=1e-5)
    assert (lp0 - ref0).abs().max() > 1e-3
