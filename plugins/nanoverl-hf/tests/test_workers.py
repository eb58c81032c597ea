"""The hf worker: modules, tokenizer, log-probs and the value model."""

from __future__ import annotations

import pytest
import torch
from conftest import prompt_batch, with_responses

from nanoverl_core import ConfigError
from nanoverl_core.algos import vanilla
from nanoverl_core.testing import with_loss_mask
from nanoverl_hf.workers import make_workers


def manual_log_probs(module, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log pi(response token) from a plain forward pass over the unpadded sequence."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = module(input_ids=ids).logits[0].float() / temperature             # (T, V)
    log_probs = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)              # predicting each response token
    return log_probs.gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_log_probs_equal_a_manual_forward_pass_at_the_rollout_temperature(tiny_dir, make_config):
    workers = make_workers(make_config(tiny_dir, "rollout.temperature=0.7"))
    tok = workers.tokenizer
    prompts, responses = ["12=", "9876="], [[5, 6, 2], [7]]                       # rows of different lengths
    batch = with_responses(prompt_batch(tok, prompts), responses, tok.pad_token_id)
    got = workers.actor.compute_log_probs(batch)                                   # (B, R)
    assert got.shape == (2, 3)
    for row, (text, response) in enumerate(zip(prompts, responses)):
        want = manual_log_probs(workers.actor.module, tok.encode(text), response, 0.7)
        torch.testing.assert_close(got[row, :len(response)], want, atol=1e-5, rtol=0)
        assert torch.all(got[row, len(response):] == 0)                             # zero on padding
    # the temperature matters: at 1.0 the numbers differ
    cold = manual_log_probs(workers.actor.module, tok.encode("12="), [5, 6, 2], 1.0)
    assert not torch.allclose(cold, got[0], atol=1e-3)


def test_left_padding_does_not_change_log_probs(tiny_dir, make_config):
    workers = make_workers(make_config(tiny_dir))
    tok = workers.tokenizer
    response = [[8, 9, 10, 2]]
    tight = with_responses(prompt_batch(tok, ["31="]), response, tok.pad_token_id)
    padded = with_responses(prompt_batch(tok, ["31="], width=9), response, tok.pad_token_id, width=7)
    a, b = workers.actor.compute_log_probs(tight), workers.actor.compute_log_probs(padded)
    torch.testing.assert_close(a[0, :4], b[0, :4], atol=1e-5, rtol=0)
    assert torch.all(b[0, 4:] == 0)
    # the same prompt batched next to a longer one (so it is padded on the left) agrees too
    mixed = with_responses(prompt_batch(tok, ["31=", "123456="]), response * 2, tok.pad_token_id)
    torch.testing.assert_close(workers.actor.compute_log_probs(mixed)[0], a[0], atol=1e-5, rtol=0)


def test_random_weights_come_from_the_seed_and_the_reference_starts_identical(tiny_dir, make_config):
    a = make_workers(make_config(tiny_dir, "trainer.seed=3", "reference.enable=true"))
    b = make_workers(make_config(tiny_dir, "trainer.seed=3"))
    c = make_workers(make_config(tiny_dir, "trainer.seed=4"))
    pa, pb, pc = (dict(w.actor.module.named_parameters()) for w in (a, b, c))
    assert sum(p.numel() for p in pa.values()) == 83_136
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["model.embed_tokens.weight"], pc["model.embed_tokens.weight"])
    ref = dict(a.reference.module.named_parameters())
    assert all(torch.equal(pa[k], ref[k]) for k in pa)
    assert all(not p.requires_grad for p in ref.values()) and a.reference.optimizer is None
    assert ref["model.embed_tokens.weight"].data_ptr() != pa["model.embed_tokens.weight"].data_ptr()


def test_value_model_round_trips_through_save_and_load(tiny_dir, make_config, tmp_path):
    cfg = make_config(tiny_dir, "critic.enable=true", "critic.lr=1e-3")
    workers = make_workers(cfg)
    critic, tok = workers.critic, workers.tokenizer
    assert critic.module.config.num_labels == 1
    backbone = dict(critic.module.model.named_parameters())                         # starts as the policy's
    policy = dict(workers.actor.module.model.named_parameters())
    assert all(torch.equal(backbone[k], policy[k]) for k in policy)
    batch = with_responses(prompt_batch(tok, ["12=", "4444="]), [[5, 6, 2], [7, 7]], tok.pad_token_id)
    before = critic.compute_values(batch)                                           # (B, R)
    assert before.shape == (2, 3) and before[1, 2] == 0 and before.abs().sum() > 0
    critic.save(tmp_path / "critic")

    fresh = make_workers(make_config(tiny_dir, "critic.enable=true", "critic.lr=1e-3", "trainer.seed=9")).critic
    assert not torch.allclose(fresh.compute_values(batch), before)
    fresh.load(tmp_path / "critic")
    torch.testing.assert_close(fresh.compute_values(batch), before, atol=0, rtol=0)
    head = dict(fresh.module.named_parameters())["score.weight"]
    torch.testing.assert_close(head, dict(critic.module.named_parameters())["score.weight"], atol=0, rtol=0)


def test_dropout_is_off_so_train_and_eval_log_probs_agree(tiny_dir, make_config):
    workers = make_workers(make_config(tiny_dir, "critic.enable=true", "critic.lr=1e-3"))
    assert workers.critic.module.dropout.p == 0.0                                  # token-classification head
    assert all(m.attention_dropout == 0.0 for m in workers.actor.module.modules() if hasattr(m, "attention_dropout"))


def test_tokenizer_without_pad_token_pads_with_eos(tmp_path, make_config):
    from nanoverl_hf.tiny import build_tiny_model
    folder = build_tiny_model(tmp_path / "m")
    cfg_path = folder / "tokenizer_config.json"
    import json
    data = json.loads(cfg_path.read_text())
    data.pop("pad_token")
    cfg_path.write_text(json.dumps(data))
    tok = make_workers(make_config(folder)).tokenizer
    assert tok.pad_token_id == tok.eos_token_id == 2 and tok.padding_side == "left"


@pytest.mark.parametrize("path, message", [
    ("{tmp}/nope", "model.path = '{tmp}/nope' does not exist"),
    ("{tmp}/nope/SmolLM2-135M-Instruct.Q4_1.gguf", "does not exist; download the GGUF file first"),
    ("{tmp}", "'model.path': '{tmp}' holds no config.json"),     # the key's declared kind, at config load
])
def test_a_bad_model_path_is_a_config_error(path, message, tmp_path, make_config):
    with pytest.raises(ConfigError, match=message.format(tmp=tmp_path).replace(".", r"\.")):
        make_workers(make_config(path.format(tmp=tmp_path)))


def test_actor_checkpoint_round_trip_keeps_tied_embeddings(tiny_dir, make_config, tmp_path):
    workers = make_workers(make_config(tiny_dir, "actor.lr=1e-2"))
    actor, tok = workers.actor, workers.tokenizer
    batch = with_responses(prompt_batch(tok, ["12=", "34="]), [[5, 6, 2], [7, 2]], tok.pad_token_id)
    batch["advantages"] = torch.tensor([[1.0, 1, 1], [-1, -1, 0]])
    with_loss_mask(batch)                                          # every sampled token counts
    batch["old_log_probs"] = actor.compute_log_probs(batch)
    actor.update(batch, vanilla)                                                             # optimizer state exists
    actor.save(tmp_path / "actor")
    fresh = make_workers(make_config(tiny_dir, "actor.lr=1e-2", "trainer.seed=5")).actor
    fresh.load(tmp_path / "actor")
    torch.testing.assert_close(fresh.compute_log_probs(batch), actor.compute_log_probs(batch), atol=0, rtol=0)
    module = fresh.module
    assert module.lm_head.weight.data_ptr() == module.model.embed_tokens.weight.data_ptr()
    assert fresh.optimizer.state_dict()["state"].keys() == actor.optimizer.state_dict()["state"].keys()
