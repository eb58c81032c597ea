"""The hf rollout: masks, greedy decoding, sampling knobs, micro-batches and weight sync."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import prompt_batch

from nanoverl_core import SamplingParams
from nanoverl_core.algos import vanilla
from nanoverl_core.data import collate, load_prompts
from nanoverl_core.testing import with_loss_mask
from nanoverl_hf.rollout import HFRollout, make_rollout
from nanoverl_hf.workers import make_workers

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPTS = ["12=", "9=", "5555=", "301=", "77=", "123456=", "8="]


def manual_greedy(module, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """Argmax decoding by full forward passes over the unpadded sequence, no KV cache."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids.append(int(module(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] == eos:
                break
    return ids[len(prompt):]


def kept(out, row: int) -> list[int]:
    return out["responses"][row][out["response_mask"][row].bool()].tolist()


def test_greedy_generation_matches_manual_decoding_and_is_deterministic(tiny_dir, make_config):
    workers = make_workers(make_config(tiny_dir, "trainer.seed=1"))
    rollout, tok = make_rollout(workers_config(workers), workers), workers.tokenizer
    batch = prompt_batch(tok, PROMPTS)
    out = rollout.generate(batch, GREEDY)
    for row, text in enumerate(PROMPTS):
        want = manual_greedy(workers.actor.module, tok.encode(text), 6, tok.eos_token_id)
        assert kept(out, row) == want, text
    again = rollout.generate(batch, GREEDY)
    assert torch.equal(again["responses"], out["responses"]) and torch.equal(again["response_mask"], out["response_mask"])


def workers_config(workers):
    return workers.actor.config


def test_micro_batches_keep_row_order(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "trainer.seed=2", "rollout.micro_batch_size=3")
    workers = make_workers(cfg)
    batch = prompt_batch(workers.tokenizer, PROMPTS, width=10)
    micro = make_rollout(cfg, workers).generate(batch, GREEDY)
    cfg.rollout.micro_batch_size = 0
    whole = make_rollout(cfg, workers).generate(batch, GREEDY)
    assert torch.equal(micro["responses"], whole["responses"])
    assert torch.equal(micro["response_mask"], whole["response_mask"])


def uniform_policy(workers):
    """Zero the (tied) embeddings: every next-token distribution is uniform over the 14 tokens."""
    with torch.no_grad():
        workers.actor.module.get_input_embeddings().weight.zero_()


def test_response_mask_covers_tokens_up_to_and_including_eos(tiny_dir, make_config):
    cfg = make_config(tiny_dir)
    workers = make_workers(cfg)
    uniform_policy(workers)
    rollout, tok = make_rollout(cfg, workers), workers.tokenizer
    torch.manual_seed(0)
    out = rollout.generate(prompt_batch(tok, ["1="] * 64), SamplingParams(max_new_tokens=12))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ended = 0
    for row in range(64):
        ids, mask = out["responses"][row].tolist(), out["response_mask"][row]
        length = int(mask.sum())
        assert mask[:length].eq(1).all() and mask[length:].eq(0).all()              # one contiguous prefix
        assert eos not in ids[:length - 1]                                          # nothing kept after an EOS
        if ids[length - 1] == eos:
            ended += 1
        else:
            assert length == 12                                                    # no EOS: cut at the budget
        assert all(t == pad for t in ids[length:])
    assert 30 < ended < 64                                                          # ~1 - (13/14)^12 = 59% end early


def test_generation_stops_once_every_row_hit_eos(tiny_dir, make_config):
    cfg = make_config(tiny_dir)
    workers = make_workers(cfg)
    uniform_policy(workers)
    torch.manual_seed(0)
    out = make_rollout(cfg, workers).generate(prompt_batch(workers.tokenizer, ["1="] * 4),
                                              SamplingParams(max_new_tokens=500))
    assert out["responses"].shape[1] < 150                                         # the budget was 500
    assert all(kept(out, r)[-1] == workers.tokenizer.eos_token_id for r in range(4))


def test_top_k_1_sampling_equals_greedy_and_sampling_is_seeded(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "trainer.seed=5")
    workers = make_workers(cfg)
    rollout = make_rollout(cfg, workers)
    batch = prompt_batch(workers.tokenizer, PROMPTS)
    greedy = rollout.generate(batch, GREEDY)
    top1 = rollout.generate(batch, SamplingParams(max_new_tokens=6, temperature=1.0, top_k=1))
    assert torch.equal(top1["responses"], greedy["responses"])
    params = SamplingParams(max_new_tokens=6, temperature=1.3, top_p=0.9)
    torch.manual_seed(11)
    a = rollout.generate(batch, params)
    torch.manual_seed(11)
    b = rollout.generate(batch, params)
    assert torch.equal(a["responses"], b["responses"]) and not torch.equal(a["responses"], greedy["responses"])


def test_checkpoint_generation_defaults_do_not_leak_into_sampling(tmp_path, make_config):
    from nanoverl_hf.tiny import build_tiny_model
    folder = build_tiny_model(tmp_path / "m")
    (folder / "generation_config.json").write_text(json.dumps(
        {"repetition_penalty": 50.0, "top_k": 1, "do_sample": True, "temperature": 0.1, "eos_token_id": 2}))
    cfg = make_config(folder, "trainer.seed=1")
    workers = make_workers(cfg)
    rollout = make_rollout(cfg, workers)
    gen = rollout._generation_config(SamplingParams(max_new_tokens=6, temperature=1.0))
    assert (gen.repetition_penalty, gen.top_k, gen.temperature, gen.do_sample) in [(None, 0, 1.0, True),
                                                                                    (1.0, 0, 1.0, True)]
    assert workers.actor.module.generation_config.repetition_penalty in (None, 1.0)
    tok = workers.tokenizer
    out = rollout.generate(prompt_batch(tok, PROMPTS), GREEDY)
    for row, text in enumerate(PROMPTS):
        assert kept(out, row) == manual_greedy(workers.actor.module, tok.encode(text), 6, tok.eos_token_id)


def train_to_answer(workers, answer: list[int], steps: int = 15):
    """A few real actor updates pushing every prompt toward `answer` (advantage +1 on it)."""
    tok = workers.tokenizer
    batch = prompt_batch(tok, ["12=", "34="])
    batch["responses"] = torch.tensor([answer, answer])
    batch["response_mask"] = torch.ones(2, len(answer))
    batch["advantages"] = torch.ones(2, len(answer))
    with_loss_mask(batch)                                          # every sampled token counts
    for _ in range(steps):
        batch["old_log_probs"] = workers.actor.compute_log_probs(batch)
        workers.actor.update(batch, vanilla)


def test_generation_uses_the_actors_updated_weights(tiny_dir, make_config, tmp_path):
    # lr 1e-2: after the 15 steps "777<eos>" leads every other token by > 5 logits. At 3e-2 Adam oscillated and
    # the <eos> after 777 led by 0.03, lost with 2 threads or another CPU's kernels (greedy went on with 7s)
    cfg = make_config(tiny_dir, "actor.lr=1e-2", "rollout.n=1")
    workers = make_workers(cfg)
    rollout, tok = make_rollout(cfg, workers), workers.tokenizer
    assert rollout.shared and rollout.module is workers.actor.module                # in-process: shared, sync is free
    batch = prompt_batch(tok, ["12=", "34=", *PROMPTS[1:]])                         # the trained prompts first
    before = rollout.generate(batch, GREEDY)
    target = [11, 11, 11, tok.eos_token_id]                                         # "777<eos>"
    assert kept(before, 0) != target
    train_to_answer(workers, target)
    rollout.sync_weights(workers.actor)
    after = rollout.generate(batch, GREEDY)
    assert kept(after, 0) == target and kept(after, 1) == target
    # and equals a freshly built model that loads those weights
    torch.save(workers.actor.module.state_dict(), tmp_path / "w.pt")
    fresh = make_workers(make_config(tiny_dir, "trainer.seed=7"))
    fresh.actor.module.load_state_dict(torch.load(tmp_path / "w.pt"))
    assert torch.equal(make_rollout(cfg, fresh).generate(batch, GREEDY)["responses"], after["responses"])


def test_a_rollout_with_its_own_copy_sees_new_weights_only_after_sync(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "trainer.seed=4")
    workers = make_workers(cfg)
    rollout = HFRollout(cfg, workers, share=False)                                  # what a sharded actor gets
    assert rollout.module is not workers.actor.module
    batch = prompt_batch(workers.tokenizer, PROMPTS)
    before = rollout.generate(batch, GREEDY)
    with torch.no_grad():
        for p in workers.actor.module.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert torch.equal(rollout.generate(batch, GREEDY)["responses"], before["responses"])   # not synced yet
    rollout.sync_weights(workers.actor)
    after = rollout.generate(batch, GREEDY)
    shared = make_rollout(cfg, workers).generate(batch, GREEDY)                     # the actor's own module
    assert torch.equal(after["responses"], shared["responses"])
    assert not torch.equal(after["responses"], before["responses"])


def test_chat_prompts_render_through_the_tokenizers_template(chat_dir, make_config, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "12"}], "target": "12"}) + "\n"
                    + json.dumps({"prompt": [{"role": "user", "content": "345"}], "target": "345"}) + "\n")
    cfg = make_config(chat_dir, f"data.train_files=[{data}]")
    workers = make_workers(cfg)
    tok = workers.tokenizer
    assert tok.chat_template                                                        # kept from the folder
    ds = load_prompts([str(data)], cfg.data, tok)
    assert ds.texts == ["12=", "345="]
    assert ds.prompt_ids[1] == [tok.convert_tokens_to_ids(c) for c in "345="]
    batch = collate(ds, [0, 1], tok.pad_token_id, "data_source")
    out = make_rollout(cfg, workers).generate(batch, GREEDY)
    for row in range(2):
        want = manual_greedy(workers.actor.module, ds.prompt_ids[row], 6, tok.eos_token_id)
        assert kept(out, row) == want


@pytest.mark.parametrize("share", [True, False])
def test_hf_rollout_and_worker_keep_the_core_contracts(tiny_dir, make_config, share):
    """nanoverl_core.testing's checks: shapes, masks and truncation, seeding from torch's global generator,
    greedy draws nothing, rows independent of their order; log-probs, full tensors and one update of the
    actor; the frozen reference without an update."""
    from nanoverl_core.testing import check_actor, check_rollout
    from nanoverl_core.testing import prompt_batch as contract_batch

    workers = make_workers(make_config(tiny_dir, "reference.enable=true"))
    rollout = HFRollout(make_config(tiny_dir), workers, share=share)
    batch = contract_batch(workers.tokenizer, ["12=", "3456=", "7="], n=2)
    batch.update(check_rollout(rollout, batch, max_new_tokens=5))
    check_actor(workers.actor, batch)
    check_actor(workers.reference, batch, update=False)
    rollout.close()


GROUPS = [text for text in ["12=", "5555=", "8=", "123456="] for _ in range(4)]
"""Four prompts of different lengths, each repeated n=4 times in adjacent rows, as a GRPO batch holds them."""
HAS_PEFT = importlib.util.find_spec("peft") is not None


@pytest.mark.parametrize("overrides", [
    [], ["rollout.micro_batch_size=6"], ["model.gradient_checkpointing=true"],
    pytest.param(["model.lora.enable=true", "model.lora.rank=4", "model.lora.alpha=8"],
                 marks=pytest.mark.skipif(not HAS_PEFT, reason="needs peft"))], ids=["whole", "micro", "ckpt", "lora"])
def test_shared_prefix_generation_equals_plain_generation(tiny_dir, make_config, overrides):
    cfg = make_config(tiny_dir, "trainer.seed=6", *overrides)
    workers = make_workers(cfg)
    with torch.no_grad():                                                   # an adapter that changes the outputs
        for name, p in workers.actor.module.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    rollout = make_rollout(cfg, workers)
    batch = prompt_batch(workers.tokenizer, GROUPS, width=9)                # left padding, 2 all-padding columns
    sampled = SamplingParams(max_new_tokens=6, temperature=1.3, top_p=0.9)
    outs = {}
    for share in (True, False):
        rollout.share_prefix = share
        torch.manual_seed(11)
        outs[share] = rollout.generate(batch, GREEDY), rollout.generate(batch, sampled)
    for a, b in zip(outs[True], outs[False]):
        assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["response_mask"], b["response_mask"])
    assert not torch.equal(outs[True][1]["responses"], outs[True][0]["responses"])   # the sampled call did draw


def test_each_distinct_prompt_prefix_is_computed_once(tiny_dir, make_config):
    workers = make_workers(make_config(tiny_dir))
    batch = prompt_batch(workers.tokenizer, GROUPS)                         # 16 rows, 4 distinct, width 7
    fed = {}
    for share in (True, False):                                             # the key, through load_config
        cfg = make_config(tiny_dir, f"rollout.hf.share_prompts={str(share).lower()}")
        rollout, shapes = make_rollout(cfg, workers), []
        hook = workers.actor.module.get_input_embeddings().register_forward_pre_hook(
            lambda module, args: shapes.append(tuple(args[0].shape)))
        try:
            rollout.generate(batch, GREEDY)
        finally:
            hook.remove()
        fed[share] = shapes
    assert fed[False][0] == (16, 7)                                         # plain: every row's whole prompt
    assert fed[True][:2] == [(4, 6), (16, 1)]                               # distinct prefixes, then each last token
    assert len(fed[True]) == len(fed[False]) + 1                            # the decode steps are the same


def test_the_kv_cache_grows_in_place_and_holds_what_concatenation_holds():
    """GrowingLayer against transformers' DynamicLayer fed the same states: a prefill, then one position at a
    time, a row reorder in between (a method that replaces the tensors), then states of a narrower dtype
    (concatenation promotes): equal keys and values after every update, written into few buffers (transformers'
    own first update, then one a growth, not one an update)."""
    from transformers.cache_utils import DynamicLayer

    from nanoverl_hf.rollout import GrowingLayer

    g = torch.Generator().manual_seed(0)
    plain, grown = DynamicLayer(), GrowingLayer()
    buffers = set()
    for step, (width, dtype) in enumerate([(5, torch.float32)] + [(1, torch.float32)] * 9 + [(2, torch.bfloat16)] * 3):
        if step == 6:                                                   # a reorder, as beam search's
            for layer in (plain, grown):
                layer.keys, layer.values = layer.keys[[1, 0]], layer.values[[1, 0]]
        k, v = (torch.randn(2, 3, width, 4, generator=g).to(dtype) for _ in range(2))
        want, got = plain.update(k, v), grown.update(k, v)
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and torch.equal(a, b), step
        assert grown.get_seq_length() == plain.get_seq_length()
        buffers.add(grown.keys.data_ptr())
    assert len(buffers) <= 5            # the first states as transformers keeps them, then a buffer per growth


@pytest.mark.parametrize("compute", ["", "bfloat16"], ids=["float32", "bf16 autocast"])
@pytest.mark.parametrize("share", [True, False], ids=["shared prompts", "plain generate"])
def test_generation_through_the_growing_cache_equals_concatenation(tiny_dir, make_config, monkeypatch, share,
                                                                   compute):
    """The same ids, greedy and sampled, with the cache grown in place and with transformers' own
    concatenation (growing() made a no-op): the views hold the numbers the concatenated tensors hold, and
    under bf16 autocast the bf16 keys the float32 ones are cast to before attention reads them."""
    import nanoverl_hf.rollout as rollout_module

    cfg = make_config(tiny_dir, "trainer.seed=6", f"model.compute_dtype={compute}")
    workers = make_workers(cfg)
    rollout = make_rollout(cfg, workers)
    rollout.share_prefix = share
    batch = prompt_batch(workers.tokenizer, GROUPS, width=9)
    sampled = SamplingParams(max_new_tokens=6, temperature=1.3, top_p=0.9)
    updates = []
    grown_update = rollout_module.GrowingLayer.update
    monkeypatch.setattr(rollout_module.GrowingLayer, "update",
                        lambda self, *args, **kwargs: updates.append(1) or grown_update(self, *args, **kwargs))
    outs = {}
    for grows in (True, False):
        if not grows:
            monkeypatch.setattr(rollout_module, "growing", lambda cache: cache)
        updates.clear()
        torch.manual_seed(11)
        outs[grows] = rollout.generate(batch, GREEDY), rollout.generate(batch, sampled)
        assert bool(updates) == grows
    for a, b in zip(outs[True], outs[False]):
        assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["response_mask"], b["response_mask"])


@pytest.mark.parametrize("compute", ["", "bfloat16"], ids=["float32", "bf16 autocast"])
def test_decoding_through_the_growing_cache_gives_the_same_logits(tiny_dir, make_config, compute):
    """Stronger than equal ids: a prefill of left-padded prompts, then 5 decoding steps through each cache,
    under the rollout's autocast: every step's logits are bitwise equal."""
    from transformers import DynamicCache

    from nanoverl_core.workers import autocast
    from nanoverl_hf.rollout import growing

    cfg = make_config(tiny_dir, f"model.compute_dtype={compute}")
    workers = make_workers(cfg)
    module = workers.actor.module.eval()
    batch = prompt_batch(workers.tokenizer, PROMPTS, width=8)
    logits = {}
    for grows in (True, False):
        cache = DynamicCache(config=module.config)
        cache = growing(cache) if grows else cache
        ids, mask, steps = batch["prompts"], batch["prompt_mask"], []
        with torch.no_grad(), autocast(cfg.model, torch.device("cpu")):
            for _ in range(6):
                out = module(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
                steps.append(out.logits[:, -1].float())
                ids = out.logits[:, -1:].argmax(-1)
                mask = torch.cat([mask, torch.ones_like(ids)], 1)
        logits[grows] = steps
        assert {type(layer).__name__ for layer in cache.layers} == {"GrowingLayer" if grows else "DynamicLayer"}
    assert all(torch.equal(a, b) for a, b in zip(logits[True], logits[False]))
