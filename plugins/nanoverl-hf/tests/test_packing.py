"""actor.pack / critic.pack: a micro-batch's rows laid end to end (workers/packing.py). Log-probs, entropy,
values, losses and every gradient equal the padded pass's, in both layouts an sdpa model packs in (ROWS,
LINES) and in ROWS with each distinct prompt laid once, on single-turn and multi-turn rows, with
micro-batches by rows and by a token budget; rows of one packed line cannot see each other; a model whose
attention ignores the positions is caught; the layout follows the attention implementation and
checkpointing; the debug worker's model cannot pack."""

from __future__ import annotations

import pytest
import torch
from conftest import prompt_batch, with_responses

from nanoverl_core import ConfigError
from nanoverl_core.algos import vanilla
from nanoverl_core.testing import with_loss_mask
from nanoverl_core.workers.packing import LINES, ONE_LINE, ROWS, pack_rows, packing_layout, row_attention
from nanoverl_hf.workers import make_workers

PROMPTS = ["12=", "9876=", "5=", "333=", "40=", "7777777="]
SHARED = ["12=", "9876=", "12=", "9876=", "9876=", "12="]      # 2 prompts, 3 samples each, interleaved
LENGTHS = [5, 1, 9, 3, 12, 2]                    # responses of mixed lengths: most of a rectangle is padding
NO_SHARING = ["actor.share_prompts=false", "critic.share_prompts=false"]


def mixed_batch(tok, multiturn: bool = False, seed: int = 0, prompts: list[str] = PROMPTS):
    """Rows of mixed prompt and response lengths with old log-probs' inputs; multiturn: an environment's
    tokens inside every longer response (model_mask 0 there), as a multi-turn episode writes them."""
    gen = torch.Generator().manual_seed(seed)
    responses = [torch.randint(3, 12, (n,), generator=gen).tolist() for n in LENGTHS]
    batch = with_responses(prompt_batch(tok, prompts, width=10), responses, tok.pad_token_id, width=14)
    if multiturn:
        model_mask = batch["response_mask"].clone()
        model_mask[:, 2:4] = 0                   # the environment's answer after the model's first two tokens
        batch["model_mask"] = model_mask
    with_loss_mask(batch)
    mask = batch["response_mask"]
    batch["advantages"] = torch.randn(mask.shape, generator=gen) * mask
    batch["returns"] = torch.randn(mask.shape, generator=gen) * mask
    batch["old_log_probs"] = -torch.rand(mask.shape, generator=gen) * mask
    batch["values"] = torch.randn(mask.shape, generator=gen) * mask
    return batch


def run(make_config, tiny_dir, pack: bool, *overrides: str, multiturn: bool = False, layout: str = ROWS,
        share: bool = False):
    """One actor update and one critic update from the same weights (packed: in `layout`; share: rows of two
    prompts, each laid once); what each pass produced."""
    cfg = make_config(tiny_dir, f"actor.pack={str(pack).lower()}", f"critic.pack={str(pack).lower()}",
                      "critic.enable=true", "actor.lr=1e-2", "critic.lr=1e-2", "actor.entropy_coeff=0.1",
                      "rollout.temperature=0.7", "data.batch_size=6", *([] if share and pack else NO_SHARING),
                      *overrides)
    workers = make_workers(cfg)
    actor, critic = workers.actor, workers.critic
    assert actor.forward_pass.packing == critic.forward_pass.packing == (ROWS if pack else None)  # sdpa's own layout
    if pack:
        actor.forward_pass.packing = critic.forward_pass.packing = layout
    batch = mixed_batch(workers.tokenizer, multiturn, prompts=SHARED if share else PROMPTS)
    with torch.no_grad():
        log_probs, entropy = actor.forward(batch, with_entropy=True)
    values = critic.compute_values(batch)
    grads = {}
    for name, worker in (("actor", actor), ("critic", critic)):
        step = worker.clip_and_step

        def recording(nonfinite, worker=worker, step=step, name=name):
            grads[name] = {n: p.grad.clone() for n, p in worker.module.named_parameters() if p.grad is not None}
            return step(nonfinite)
        worker.clip_and_step = recording
    metrics = {**actor.update(batch, vanilla), **critic.update(batch)}
    return batch, log_probs, entropy, values, grads, metrics, actor.compute_log_probs(batch)


def assert_same_gradients(got: dict, want: dict, rtol: float = 1e-5) -> float:
    """Every gradient tensor within rtol of the other relative to its own size; returns the largest ratio."""
    assert got.keys() == want.keys() and want
    worst = 0.0
    for name in want:
        scale = want[name].abs().max().clamp(min=1e-12)
        worst = max(worst, float((got[name] - want[name]).abs().max() / scale))
        assert worst <= rtol, f"{name}: {worst:.2e}"
    return worst


@pytest.mark.parametrize("multiturn", [False, True], ids=["single-turn", "multi-turn"])
@pytest.mark.parametrize("split", [[], ["actor.micro_batch_size=2", "critic.micro_batch_size=2"],
                                   ["actor.max_tokens_per_micro_batch=30", "critic.max_tokens_per_micro_batch=30"]],
                         ids=["whole", "rows", "budget"])
@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("layout", [ROWS, LINES, SHARED_ROWS := "rows, prompts shared"])
def test_packed_passes_and_updates_equal_the_padded_ones(tiny_dir, make_config, multiturn, split, chunk, layout):
    share = layout == SHARED_ROWS
    padded = run(make_config, tiny_dir, False, f"actor.logits_chunk_size={chunk}", *split, multiturn=multiturn,
                 share=share)
    packed = run(make_config, tiny_dir, True, f"actor.logits_chunk_size={chunk}", *split, multiturn=multiturn,
                 layout=ROWS if share else layout, share=share)
    batch, mask = padded[0], padded[0]["response_mask"].bool()
    for want, got in zip(padded[1:4], packed[1:4]):         # log-probs, entropy, values
        torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[3], padded[3], rtol=0, atol=1e-5)   # values: 0 on padding, both ways
    for name in ("actor", "critic"):
        assert_same_gradients(packed[4][name], padded[4][name])
    assert packed[5].keys() == padded[5].keys()
    for key in padded[5]:                                    # the losses and every logged number
        assert packed[5][key] == pytest.approx(padded[5][key], rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(packed[6], padded[6], rtol=0, atol=1e-5)   # after the update: still equal
    assert (packed[6] - batch["old_log_probs"]).abs().max() > 1e-3


@pytest.mark.parametrize("layout", [ROWS, LINES])
def test_rows_of_one_packed_line_cannot_see_each_other(tiny_dir, make_config, layout):
    workers = make_workers(make_config(tiny_dir, "actor.pack=true", "actor.share_prompts=false",
                                       "data.batch_size=6"))
    actor, batch = workers.actor, mixed_batch(workers.tokenizer)
    actor.forward_pass.packing = layout
    packed = pack_rows(batch, layout)
    assert packed.input_ids.shape[0] < len(batch)           # rows do share lines
    line_of = packed.line[:, 0].tolist()
    neighbour = next(b for b in range(1, len(batch)) if line_of[b] == line_of[0])
    changed = batch.index(list(range(len(batch))))
    changed["prompts"] = batch["prompts"].clone()
    changed["responses"] = batch["responses"].clone()
    real = batch["prompt_mask"][0].bool()
    changed["prompts"][0, real] = (batch["prompts"][0, real] - 3 + 1) % 9 + 3       # other digits, same length
    changed["responses"][0] = (batch["responses"][0] - 3 + 1) % 9 + 3
    before, after = actor.compute_log_probs(batch), actor.compute_log_probs(changed)
    others = [b for b in range(len(batch)) if b != 0]
    assert (after[0] - before[0]).abs().max() > 1e-3         # row 0 itself moved
    torch.testing.assert_close(after[others], before[others], rtol=0, atol=1e-6)   # its line-mate did not
    assert neighbour in others

    # the test has teeth: positions that do not restart make the line one sequence, and the line-mate moves
    leaky = dict(packed.inputs(keep_logits=False), position_ids=torch.arange(packed.input_ids.shape[1])[None]
                 .expand_as(packed.input_ids))
    changed_packed = pack_rows(changed, layout)
    with torch.no_grad():
        a = packed.pick(actor.module(**leaky).logits)
        b = changed_packed.pick(actor.module(**dict(leaky, input_ids=changed_packed.input_ids)).logits)
    assert (a[neighbour] - b[neighbour])[packed.valid[neighbour]].abs().max() > 1e-4


def test_one_line_layout_holds_every_row_once_in_row_order(tiny_dir, make_config):
    workers = make_workers(make_config(tiny_dir, "data.batch_size=6"))
    batch = mixed_batch(workers.tokenizer)
    one = pack_rows(batch, ONE_LINE)
    lengths = batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1).long()
    assert one.input_ids.shape == (1, int(lengths.sum()))
    starts = (one.position_ids[0] == 0).nonzero()[:, 0]
    assert starts.tolist() == [0, *lengths.cumsum(0)[:-1].tolist()]


def test_the_debug_model_cannot_pack_auto_falls_back_and_true_exits_2(tmp_path):
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.builtins.debug import make_workers as make_debug_workers

    data = tmp_path / "t.jsonl"
    data.write_text('{"prompt": "1=", "target": "1"}\n')
    registry = load_registry()
    auto = make_debug_workers(load_config(None, [f"data.train_files=[{data}]"], registry=registry))
    assert auto.actor.forward_pass.packing is None
    with pytest.raises(ConfigError, match=r"^actor\.pack = true, but TinyCausalLM cannot run packed rows"):
        make_debug_workers(load_config(None, [f"data.train_files=[{data}]", "actor.pack=true"], registry=registry))


def test_a_model_that_ignores_the_positions_is_caught(tiny_dir, make_config, capsys):
    """In LINES the restarting positions are what keeps rows apart (ROWS attends to each row on its own)."""
    for pack in ("auto", "true"):
        workers = make_workers(make_config(tiny_dir, f"actor.pack={pack}", "actor.share_prompts=false",
                                           "data.batch_size=6"))
        actor, batch = workers.actor, mixed_batch(workers.tokenizer)
        actor.forward_pass.packing = LINES
        forward = actor.module.forward

        def blind(*args, forward=forward, **kwargs):        # positions 0, 1, ... over the whole line
            ids = kwargs["input_ids"]
            kwargs["position_ids"] = torch.arange(ids.shape[1])[None].expand_as(ids)
            return forward(*args, **kwargs)
        actor.module.forward = blind
        if pack == "true":
            with pytest.raises(ConfigError, match=r"^actor\.pack = true, but .* lets packed rows attend"):
                actor.compute_log_probs(batch)
            continue
        actor.module.forward = blind
        log_probs = actor.compute_log_probs(batch)
        assert actor.forward_pass.packing is None and "actor.pack is off for this run" in capsys.readouterr().err
        actor.module.forward = forward
        torch.testing.assert_close(log_probs, actor.compute_log_probs(batch), rtol=0, atol=1e-6)


def test_rows_lay_each_prompt_once_and_lines_share_it_where_the_cache_runs_fewer_tokens(tiny_dir, make_config):
    """ROWS with shared prompts: each distinct prompt once in the line, then its rows' responses (fewer tokens
    than the cache or packing alone). LINES: n samples of one long prompt with short responses go through
    the shared cache, which runs fewer tokens there; responses of very different lengths are packed. Either
    way the log-probs are the padded ones."""
    workers = make_workers(make_config(tiny_dir, "rollout.n=6", "data.batch_size=1"))
    actor, tok = workers.actor, workers.tokenizer
    fed: list[tuple[int, int]] = []
    actor.module.get_input_embeddings().register_forward_pre_hook(lambda _, args: fed.append(tuple(args[0].shape)))
    long_prompt = prompt_batch(tok, ["123456789012345="] * 6)
    short = with_responses(long_prompt, [[3, 4]] * 6, tok.pad_token_id)
    mixed = with_responses(prompt_batch(tok, ["1="] * 6), [[3] * n for n in (1, 1, 1, 1, 1, 40)], tok.pad_token_id)
    plain = make_workers(make_config(tiny_dir, "actor.pack=false", "actor.share_prompts=false")).actor
    assert actor.forward_pass.packing == ROWS
    for batch in (short, mixed):
        fed.clear()
        torch.testing.assert_close(actor.compute_log_probs(batch), plain.compute_log_probs(batch), rtol=0, atol=1e-5)
        prompt, responses = int(batch["prompt_mask"][0].sum()), int(batch["response_mask"].sum())
        assert fed[-1] == (1, prompt + responses)                  # (1, 16 + 12), then (1, 2 + 45)
    assert "share_prompts" not in actor.forward_pass.checked      # the KV cache was never needed

    actor.forward_pass.packing = LINES
    fed.clear()
    torch.testing.assert_close(actor.compute_log_probs(short), plain.compute_log_probs(short), rtol=0, atol=1e-5)
    assert fed[-1] == (6, 1 + 2)                                  # continued from the shared cache
    fed.clear()
    torch.testing.assert_close(actor.compute_log_probs(mixed), plain.compute_log_probs(mixed), rtol=0, atol=1e-5)
    assert fed == [(2, 42)]                     # lines of the longest row (42 tokens), not 6 x 42 nor 6 x 41 + 1


def test_the_layout_follows_the_attention_implementation_and_checkpointing(tiny_dir, make_config):
    """sdpa packs in ROWS; eager, a sliding window or activation checkpointing (whose recomputation in
    backward runs outside the packed forward's attention switch) in LINES; the two give the same log-probs."""
    workers = make_workers(make_config(tiny_dir, "actor.pack=true", "actor.share_prompts=false",
                                       "data.batch_size=6"))
    actor, batch, config = workers.actor, mixed_batch(workers.tokenizer), workers.actor.module.config
    assert config._attn_implementation == "sdpa" and packing_layout(actor.module) == ROWS
    rows = actor.compute_log_probs(batch)
    assert config._attn_implementation == "sdpa"                # switched back after the packed forward
    config._attn_implementation = "eager"
    assert packing_layout(actor.module) == LINES
    actor.forward_pass.packing = LINES
    torch.testing.assert_close(actor.compute_log_probs(batch), rows, rtol=0, atol=1e-5)
    config._attn_implementation = "sdpa"
    config.sliding_window = 4
    assert packing_layout(actor.module) == LINES
    config.sliding_window = None
    checkpointed = make_workers(make_config(tiny_dir, "actor.pack=true", "model.gradient_checkpointing=true"))
    assert checkpointed.actor.forward_pass.packing == LINES


@pytest.mark.parametrize("bounds", [(0, 2, 5, 7), (0, 2, 4, 6, 9, 11)], ids=["a call a row", "a call a length"])
def test_row_attention_attends_each_row_alone_and_refuses_what_it_would_not_apply(bounds):
    """Rows laid end to end, each attended causally on its own: lengths 2, 3, 2 (one call a row), or
    2, 2, 2, 3, 2 (the rows of one length in one call)."""
    q = torch.randn(1, 2, bounds[-1], 4)
    starts = torch.tensor(bounds)
    module = torch.nn.Module()
    out, _ = row_attention(module, q, q, q, None, cu_seq_lens_q=starts)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = torch.cat([sdpa(q[..., a:b, :], q[..., a:b, :], q[..., a:b, :], is_causal=True)
                      for a, b in zip(bounds, bounds[1:])], 2)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=0, atol=1e-6)
    for bad in ({"sliding_window": 2}, {"softcap": 30.0}):
        with pytest.raises(ValueError, match="plain causal attention"):
            row_attention(module, q, q, q, None, cu_seq_lens_q=starts, **bad)
    with pytest.raises(ValueError, match="plain causal attention"):
        row_attention(module, q, q, q, torch.ones(1, 1, 5, 5, dtype=torch.bool), cu_seq_lens_q=starts)


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["a key head a query head", "grouped query heads"])
@pytest.mark.parametrize("lengths, prefixes", [((3, 2, 4, 2, 2), (-1, 0, 0, -1, 3)),
                                              ((3, 2, 2, 2, 3, 2, 2), (-1, 0, 0, 0, -1, 4, 4))],
                         ids=["a call a segment", "a call a shape"])
def test_row_attention_attends_a_shared_prompt_then_each_response_alone(lengths, prefixes, kv_heads):
    """Prompts its rows share, each followed by its rows' responses: a response attends to its prompt's keys,
    then causally to its own, never to another response or prompt; with fewer key / value heads than query
    heads each serves its group of query heads (values and gradients those of repeating it for them)."""
    bounds = torch.tensor([0, *lengths]).cumsum(0)
    q = torch.randn(1, 2, int(bounds[-1]), 4, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, int(bounds[-1]), 4, requires_grad=True) for _ in range(2))
    out, _ = row_attention(torch.nn.Module(), q, k, v, None, cu_seq_lens_q=bounds, row_prefixes=prefixes)
    want = []
    repeat = 2 // kv_heads
    for s, prefix in enumerate(prefixes):
        a, b = bounds[s], bounds[s + 1]
        keys = list(range(bounds[prefix], bounds[prefix + 1])) if prefix >= 0 else []
        keys += list(range(a, b))
        mask = torch.ones(b - a, len(keys), dtype=torch.bool).tril(len(keys) - (b - a))
        want.append(torch.nn.functional.scaled_dot_product_attention(
            q[..., a:b, :], k[..., keys, :].repeat_interleave(repeat, 1), v[..., keys, :].repeat_interleave(repeat, 1),
            attn_mask=mask))
    want = torch.cat(want, 2).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    weight = torch.randn(out.shape)
    for got, expected in zip(torch.autograd.grad((out * weight).sum(), (q, k, v)),
                             torch.autograd.grad((want * weight).sum(), (q, k, v))):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_the_pass_that_finds_the_prompt_cache_broken_is_laid_out_as_every_later_pass(tiny_dir, make_config, capsys):
    """The one-time cache check runs before its pass chooses between sharing and packing (LINES: ROWS lays the
    prompts in the line), so that pass is packed like every later one: a resumed run meets the check at
    another step than the unbroken run and must compute, bit for bit, what that run computed."""
    workers = make_workers(make_config(tiny_dir, "rollout.n=6", "data.batch_size=1"))
    actor, tok = workers.actor, workers.tokenizer
    actor.forward_pass.packing = LINES
    forward = actor.module.forward

    def forgetful(*args, **kwargs):                     # ignores the cache it is given: the check fails
        kwargs.pop(actor.forward_pass.cache_keyword, None)
        return forward(*args, **kwargs)
    actor.module.forward = forgetful
    responses = [[3, 4], [5], [3, 4, 5, 6], [7, 8, 9], [3], [4, 4]]
    batch = with_responses(prompt_batch(tok, ["123456789012345="] * 6), responses, tok.pad_token_id)
    fed: list[tuple[int, int]] = []
    actor.module.get_input_embeddings().register_forward_pre_hook(lambda _, args: fed.append(tuple(args[0].shape)))
    first = actor.compute_log_probs(batch)               # sharing runs fewer tokens here, until the check fails
    assert actor.forward_pass.cache_keyword is None and "actor.share_prompts is off" in capsys.readouterr().err
    first_pass = fed[-1]
    fed.clear()
    assert torch.equal(actor.compute_log_probs(batch), first)
    assert first_pass == fed[-1] == (6, 16 + 4)          # packed both times: a row a line (no two fit in 20)
