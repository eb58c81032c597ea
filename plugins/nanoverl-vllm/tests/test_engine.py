"""The vllm rollout on a real engine: same outputs as the hf rollout, same log-probs as the hf worker,
weight sync after real updates, and recovery from a sync that fails half-way.

One engine (~5 s to start on CPU) serves the module; `fresh` puts the initial weights back in the
actor and syncs them before each test.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch

pytest.importorskip("vllm")

from conftest import kept, prompt_batch  # noqa: E402

from nanoverl_core import ConfigError, SamplingParams  # noqa: E402
from nanoverl_core.algos import vanilla  # noqa: E402
from nanoverl_core.testing import with_loss_mask  # noqa: E402
from nanoverl_hf.rollout import HFRollout  # noqa: E402
from nanoverl_hf.workers import make_workers  # noqa: E402
from nanoverl_vllm.rollout import VLLMRollout, make_rollout  # noqa: E402

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPTS = ["12=", "9=", "5555=", "301=", "77=", "123456=", "8="]


def scramble(module, seed: int, scale: float = 0.5) -> None:
    """Add seeded noise to every weight: a random-init tiny model answers almost everything with '=',
    a scrambled one gives varied responses, so equality checks mean something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


@pytest.fixture(scope="module")
def engine(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "trainer.seed=3", "actor.lr=3e-2")
    workers = make_workers(cfg)
    scramble(workers.actor.module, seed=0)
    initial = {k: v.clone() for k, v in workers.actor.module.state_dict().items()}
    rollout = make_rollout(cfg, workers)
    yield cfg, workers, rollout, initial
    rollout.close()


@pytest.fixture
def fresh(engine):
    cfg, workers, rollout, initial = engine
    workers.actor.module.load_state_dict(initial)
    workers.actor.temperature = cfg.rollout.temperature
    rollout.sync_weights(workers.actor)
    return cfg, workers, rollout


def hf_greedy(cfg, workers, batch):
    return HFRollout(cfg, workers).generate(batch, GREEDY)     # generates with the actor's own module


def test_greedy_output_is_the_hf_rollouts_token_for_token(fresh):
    cfg, workers, rollout = fresh
    batch = prompt_batch(workers.tokenizer, PROMPTS, width=10)              # extra left padding on every row
    out, want = rollout.generate(batch, GREEDY), hf_greedy(cfg, workers, batch)
    assert set(out.keys()) == set(want.keys()) | {"rollout_log_probs"}
    for key in want.keys():
        assert out[key].dtype == want[key].dtype and out[key].shape == want[key].shape, key
    assert torch.equal(out["responses"], want["responses"])
    assert torch.equal(out["response_mask"], want["response_mask"])
    assert len({tuple(kept(out, r)) for r in range(len(PROMPTS))}) >= 3      # varied answers, not all '='


def test_rows_keep_their_order(fresh):
    _, workers, rollout = fresh
    batch = prompt_batch(workers.tokenizer, PROMPTS)
    out = rollout.generate(batch, GREEDY)
    flipped = rollout.generate(batch.index(list(reversed(range(len(PROMPTS))))), GREEDY)
    for row in range(len(PROMPTS)):
        assert kept(flipped, len(PROMPTS) - 1 - row) == kept(out, row)


def test_vllm_rollout_keeps_the_core_rollout_contract(fresh):
    """nanoverl_core.testing.check_rollout on the real engine: shapes, masks and rollout_log_probs,
    seeds drawn from torch's global generator, greedy calls drawing nothing, rows independent of order.
    (Placed before the tests that start and stop engines of their own, which tear down vLLM's
    process-wide parallel state that the module's engine shares.)"""
    from nanoverl_core.testing import check_rollout
    from nanoverl_core.testing import prompt_batch as contract_batch

    _, workers, rollout = fresh
    out = check_rollout(rollout, contract_batch(workers.tokenizer, PROMPTS[:4], n=2), max_new_tokens=6)
    assert "rollout_log_probs" in out


@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_rollout_log_probs_equal_the_hf_workers(fresh, temperature):
    _, workers, rollout = fresh
    workers.actor.temperature = temperature                                 # the trainer's log-probs use it too
    batch = prompt_batch(workers.tokenizer, PROMPTS * 8)
    torch.manual_seed(0)
    out = rollout.generate(batch, SamplingParams(max_new_tokens=8, temperature=temperature))
    batch.update(out)
    want = workers.actor.compute_log_probs(batch)                           # (B, R), zero on padding
    mask = out["response_mask"].bool()
    assert out["rollout_log_probs"].shape == want.shape
    assert (out["rollout_log_probs"][~mask] == 0).all()
    diff = (out["rollout_log_probs"] - want)[mask].abs().max().item()
    assert diff < 1e-4, diff                                                 # measured ~3e-6 in float32
    assert want[mask].mean() < -0.1                                         # real sampling, not near-greedy


def test_sampling_is_seeded_by_torch_and_top_k_1_is_greedy(fresh):
    _, workers, rollout = fresh
    batch = prompt_batch(workers.tokenizer, PROMPTS)
    greedy = rollout.generate(batch, GREEDY)
    top1 = rollout.generate(batch, SamplingParams(max_new_tokens=6, temperature=1.0, top_k=1))
    assert torch.equal(top1["responses"], greedy["responses"])
    params = SamplingParams(max_new_tokens=6, temperature=1.3, top_p=0.9)
    torch.manual_seed(11)
    a = rollout.generate(batch, params)
    torch.manual_seed(11)
    rollout.generate(batch, GREEDY)                                         # validation draws no random numbers
    b = rollout.generate(batch, params)
    assert torch.equal(a["responses"], b["responses"]) and not torch.equal(a["responses"], greedy["responses"])
    same_prompt = rollout.generate(prompt_batch(workers.tokenizer, ["12="] * 16), params)
    assert len({tuple(kept(same_prompt, r)) for r in range(16)}) > 4       # rows of one prompt differ


def test_sampling_more_prompt_tokens_than_one_engine_step_takes(fresh):
    """Seeded sampling of a batch whose prompts hold more tokens than vLLM schedules in one step
    (4096): chunked prefill would split a prompt, and vLLM then rewinds the CPU generator's offset,
    which fails ("CPU Generator does not use offset"); the engine prefills prompts whole instead."""
    _, workers, rollout = fresh
    batch = prompt_batch(workers.tokenizer, ["12345678901234="] * 300)       # 300 x 15+ tokens > 4096
    torch.manual_seed(0)
    out = rollout.generate(batch, SamplingParams(max_new_tokens=2, temperature=1.0))
    assert out["responses"].shape == (300, 2) and bool(out["response_mask"][:, 0].all())


def test_response_mask_covers_tokens_up_to_and_including_eos(fresh):
    _, workers, rollout = fresh
    with torch.no_grad():
        workers.actor.module.get_input_embeddings().weight.zero_()           # tied: uniform over 14 tokens
    rollout.sync_weights(workers.actor)
    tok = workers.tokenizer
    torch.manual_seed(0)
    out = rollout.generate(prompt_batch(tok, ["1="] * 64), SamplingParams(max_new_tokens=12))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ended = 0
    for row in range(64):
        ids, mask = out["responses"][row].tolist(), out["response_mask"][row]
        length = int(mask.sum())
        assert mask[:length].eq(1).all() and mask[length:].eq(0).all()
        assert eos not in ids[:length - 1]
        if ids[length - 1] == eos:
            ended += 1
        else:
            assert length == 12
        assert all(t == pad for t in ids[length:])
    assert 30 < ended < 64                                                   # ~1 - (13/14)^12 = 59% end early
    lp = out["rollout_log_probs"][out["response_mask"].bool()]
    assert torch.allclose(lp, torch.full_like(lp, -torch.log(torch.tensor(14.0)).item()), atol=1e-5)


def train_to_answer(workers, answer: list[int], steps: int = 40):
    """Real actor updates pushing two prompts toward `answer` (advantage +1 on every token)."""
    batch = prompt_batch(workers.tokenizer, ["12=", "34="])
    batch["responses"] = torch.tensor([answer, answer])
    batch["response_mask"] = torch.ones(2, len(answer))
    batch["advantages"] = torch.ones(2, len(answer))
    with_loss_mask(batch)                                          # every sampled token counts
    for _ in range(steps):
        batch["old_log_probs"] = workers.actor.compute_log_probs(batch)
        workers.actor.update(batch, vanilla)


def test_sync_after_real_updates_gives_the_hf_greedy_output(fresh):
    cfg, workers, rollout = fresh
    tok = workers.tokenizer
    batch = prompt_batch(tok, ["12=", "34=", *PROMPTS[1:]])
    before = rollout.generate(batch, GREEDY)
    target = [11] * 6                                                        # "777777", cut at the budget
    assert kept(before, 0) != target
    train_to_answer(workers, target)
    assert torch.equal(rollout.generate(batch, GREEDY)["responses"], before["responses"])   # not synced yet
    rollout.sync_weights(workers.actor)
    assert rollout.last_sync_s < 1.0
    after = rollout.generate(batch, GREEDY)
    assert kept(after, 0) == target and kept(after, 1) == target
    assert torch.equal(after["responses"], hf_greedy(cfg, workers, batch)["responses"])


def fail_half_way(weights):
    """The actor's tensors, but the stream breaks after half of them (a rank dying mid-gather, say)."""
    weights = list(weights)
    yield from weights[: len(weights) // 2]
    raise RuntimeError("weight stream broke")


def test_a_failed_sync_restarts_the_engine_from_the_current_weights(fresh, caplog):
    cfg, workers, rollout = fresh
    batch = prompt_batch(workers.tokenizer, PROMPTS)
    old_llm, restarts = rollout.llm, rollout.restarts
    scramble(workers.actor.module, seed=1)
    torch.manual_seed(7)
    random.seed(7)
    want_draws = (torch.rand(2).tolist(), random.random())
    torch.manual_seed(7)
    random.seed(7)
    with caplog.at_level(logging.WARNING, logger="nanoverl_vllm"):
        rollout.sync_weights(workers.actor, weights=fail_half_way(workers.actor.full_tensors()))
    assert "weight stream broke" in caplog.text and "restarting" in caplog.text
    assert (torch.rand(2).tolist(), random.random()) == want_draws           # vLLM's re-seeding was undone
    assert rollout.restarts == restarts + 1 and rollout.llm is not old_llm
    assert torch.equal(rollout.generate(batch, GREEDY)["responses"], hf_greedy(cfg, workers, batch)["responses"])
    scramble(workers.actor.module, seed=2)                                   # the new engine syncs in place too
    rollout.sync_weights(workers.actor)
    assert rollout.restarts == restarts + 1
    assert torch.equal(rollout.generate(batch, GREEDY)["responses"], hf_greedy(cfg, workers, batch)["responses"])


def test_unsupported_settings_are_config_errors_before_the_engine_starts(tmp_path, make_config):
    from nanoverl_hf.tiny import build_tiny_model

    four_heads = build_tiny_model(tmp_path / "m4")                          # head_dim 16
    cfg = make_config(four_heads)
    with pytest.raises(ConfigError, match="head_dim 16"):
        VLLMRollout(cfg, make_workers(cfg))
    two_heads = build_tiny_model(tmp_path / "m2", heads=2)
    cfg = make_config(two_heads, "rollout.temperature=2.5")
    with pytest.raises(ConfigError, match=r"rollout.temperature = 2.5"):
        VLLMRollout(cfg, make_workers(cfg))
    cfg = make_config(two_heads, "data.max_prompt_length=200")
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        VLLMRollout(cfg, make_workers(cfg))


def test_the_engine_holds_its_weights_in_the_compute_dtype_when_set(tiny_dir, make_config, tmp_path):
    """vLLM has no autocast: with model.compute_dtype set the engine runs in it (weights included, each sync
    casting the actor's float32 tensors as they load); unset, in model.dtype as before."""
    from nanoverl_vllm.engine import engine_kwargs, write_engine_folder

    for compute, want in (("", "float32"), ("bfloat16", "bfloat16")):
        cfg = make_config(tiny_dir, f"model.compute_dtype={compute}")
        folder = tmp_path / f"engine_{want}"
        hf_config = write_engine_folder(make_workers(cfg).actor.module, folder)
        assert engine_kwargs(cfg, folder, hf_config, load_format="dummy", sleep=False)["dtype"] == want


def test_sleeping_between_generate_calls_keeps_outputs_right(tiny_dir, make_config):
    """The sleep / wake-up sequence used on GPU (level 2 drops the weights), run on CPU where vLLM's
    worker makes the memory part a no-op: what is checked is that the rollout never generates from
    dropped weights, whether or not a sync came in between."""
    cfg = make_config(tiny_dir, "trainer.seed=5")
    workers = make_workers(cfg)
    scramble(workers.actor.module, seed=3)
    rollout = VLLMRollout(cfg, workers, sleep=True)
    try:
        batch = prompt_batch(workers.tokenizer, PROMPTS)
        first = rollout.generate(batch, GREEDY)
        assert rollout.asleep and rollout.llm.llm_engine.is_sleeping()
        assert torch.equal(rollout.generate(batch, GREEDY)["responses"], first["responses"])   # woke up by itself
        scramble(workers.actor.module, seed=4)
        rollout.sync_weights(workers.actor)                                  # wakes, loads, wakes the KV cache
        assert not rollout.asleep and not rollout.llm.llm_engine.is_sleeping()
        assert torch.equal(rollout.generate(batch, GREEDY)["responses"], hf_greedy(cfg, workers, batch)["responses"])
        assert rollout.restarts == 0
    finally:
        rollout.close()


def test_on_cpu_the_engine_runs_one_training_calls_rows_at_once_and_sizes_its_kv_cache_for_them(tiny_dir, make_config,
                                                                                                  tmp_path):
    """[rollout.vllm] max_num_seqs = 0: the training call's rows (at least 64) run at once, and the KV cache
    holds that many full-length sequences x1.5, whatever the validation batch; a larger batch runs in
    waves and gives the same greedy responses (here 7 rows through an engine of 2)."""
    from nanoverl_vllm.engine import engine_kwargs, write_engine_folder

    cfg = make_config(tiny_dir, "data.batch_size=16", "rollout.n=8", "data.val_batch_size=64", "rollout.val_n=4")
    hf_config = write_engine_folder(make_workers(cfg).actor.module, tmp_path)
    kwargs = engine_kwargs(cfg, tmp_path, hf_config, load_format="dummy", sleep=False)
    per_token = 2 * 2 * 2 * 32 * 4                                  # k and v, 2 layers, 2 heads of 32, fp32
    assert kwargs["max_num_seqs"] == 128                            # 16 x 8, not the 256 validation rows
    assert kwargs["kv_cache_memory_bytes"] == max(64 << 20, int(1.5 * 128 * 128 * per_token))   # 28 tokens: a block
    small = make_config(tiny_dir, "data.batch_size=2")
    assert engine_kwargs(small, tmp_path, hf_config, load_format="dummy", sleep=False)["max_num_seqs"] == 64

    cfg = make_config(tiny_dir, "trainer.seed=5", "rollout.vllm.max_num_seqs=2")
    workers = make_workers(cfg)
    scramble(workers.actor.module, seed=3)
    rollout = make_rollout(cfg, workers)
    try:
        assert rollout.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 2
        batch = prompt_batch(workers.tokenizer, PROMPTS)
        assert torch.equal(rollout.generate(batch, GREEDY)["responses"], hf_greedy(cfg, workers, batch)["responses"])
    finally:
        rollout.close()


def _resident_kv_bytes(rollout) -> int:
    """Bytes of the engine's KV cache that are in RAM now (mincore over each distinct storage's pages)."""
    import ctypes
    import os

    def count(worker) -> int:
        libc = ctypes.CDLL(None)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        page, total, seen = os.sysconf("SC_PAGE_SIZE"), 0, set()
        for tensor in worker.model_runner.kv_caches:
            start, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
            if start in seen:
                continue
            seen.add(start)
            first, last = -(-start // page) * page, (start + size) // page * page
            vec = ctypes.create_string_buffer((last - first) // page)
            assert libc.mincore(first, last - first, vec) == 0
            total += sum(b & 1 for b in vec.raw) * page
        return total
    return sum(rollout.llm.collective_rpc(count))


def test_on_cpu_the_kv_cache_goes_back_to_the_os_after_each_batch(tiny_dir, make_config):
    """vLLM's CPU worker has no sleep mode, so the rollout gives the KV cache's pages back itself after
    each batch ([rollout.vllm] release_kv_cache, on by default): none stays resident between batches, and
    the next batch samples what an engine that kept its cache samples."""
    batch = None
    samples, resident = {}, {}
    for release in ("true", "false"):
        cfg = make_config(tiny_dir, "trainer.seed=5", f"rollout.vllm.release_kv_cache={release}")
        workers = make_workers(cfg)
        scramble(workers.actor.module, seed=3)
        rollout = make_rollout(cfg, workers)
        try:
            batch = prompt_batch(workers.tokenizer, PROMPTS * 32)            # 224 rows: one 128-token block each
            params = SamplingParams(max_new_tokens=12, temperature=1.0)
            torch.manual_seed(0)
            samples[release] = [rollout.generate(batch, params)["responses"] for _ in range(2)]
            resident[release] = _resident_kv_bytes(rollout)
        finally:
            rollout.close()
    block = 2 * 2 * 2 * 32 * 4 * 128                                         # k and v, 2 layers, 2 heads of 32, fp32
    assert resident["false"] >= 224 * block                                    # the blocks the batch used stay in RAM
    assert resident["true"] == 0
    for kept_cache, released in zip(samples["false"], samples["true"]):
        assert torch.equal(kept_cache, released)
    assert not torch.equal(*samples["true"])                                   # two different draws, both equal



# ---- multi-turn episodes ---------------------------------------------------------------------------------
class _Answers:
    """Answers every turn with "=" and one digit (the environment's tokens, out of the loss_mask)."""

    def step(self, turn):
        from nanoverl_core.env import EnvStep
        return EnvStep(observation=f"={turn.index}", reward=1.0)


def _episodes(cfg, workers, rollout, batch, max_turns):
    import attrs
    from nanoverl_core.env import EpisodeRollout, InProcess

    cfg = attrs.evolve(cfg, rollout=attrs.evolve(cfg.rollout, max_new_tokens=20),      # 3 turns of 4 + 2 answers
                       environment=attrs.evolve(cfg.environment, name="answers", max_turns=max_turns,
                                                max_turn_tokens=4))
    sampled = []
    generate = rollout.generate

    def recording(sub, params):
        out = generate(sub, params)
        sampled.append([kept(out, row) for row in range(len(sub))])
        return out
    rollout.generate = recording
    try:
        out = EpisodeRollout(rollout, InProcess(lambda row: _Answers(), None, 0), cfg, workers.tokenizer,
                             name="answers").generate(
            batch, SamplingParams(max_new_tokens=20, temperature=1.0))
    finally:
        del rollout.generate
    return out, sampled


def _mismatch(workers, batch, out) -> tuple[float, float]:
    """(max |rollout - trainer| log-prob, the k3 KL estimate) over the model's tokens; k3 in float64: at
    differences of ~1e-5, exp(x) - 1 - x (~x^2 / 2) is below float32's rounding and comes out of any sign."""
    full = batch.index(list(range(len(batch))))
    full.update(out)
    trainer = workers.actor.compute_log_probs(full)
    mask = out["model_mask"].bool()
    log_ratio = (trainer.double() - out["rollout_log_probs"].double())[mask]
    return float(log_ratio.abs().max()), float((log_ratio.exp() - 1 - log_ratio).mean())


def test_multiturn_episodes_keep_the_engines_tokens_and_log_probs(fresh):
    """The ids trained on are the engine's, bit for bit, over three turns; the engine's log-probs of them
    agree with the trainer's as closely as on single-turn responses (re-tokenising would break both)."""
    cfg, workers, rollout = fresh
    batch = prompt_batch(workers.tokenizer, PROMPTS * 4)
    batch["index"], batch["row"] = list(range(len(batch))), [{}] * len(batch)
    torch.manual_seed(0)
    out, sampled = _episodes(cfg, workers, rollout, batch, max_turns=3)
    assert len(sampled) == 3 and out["num_turns"].eq(3).all()
    for row in range(len(batch)):
        expected = sampled[0][row] + workers.tokenizer.encode("=0") + sampled[1][row] + \
            workers.tokenizer.encode("=1") + sampled[2][row]
        assert kept(out, row) == expected
    multi = _mismatch(workers, batch, out)
    torch.manual_seed(0)
    single = rollout.generate(batch, SamplingParams(max_new_tokens=12, temperature=1.0))
    single["model_mask"] = single["response_mask"]
    single = _mismatch(workers, batch, single)
    assert multi[0] < 1e-4, (multi, single)                     # measured: both ~3e-6 in float32
    assert multi[1] <= 2 * single[1] + 1e-10, (multi, single)


def test_an_engine_that_sleeps_stays_awake_through_an_episodes_turns(tiny_dir, make_config):
    cfg = make_config(tiny_dir, "trainer.seed=5")
    workers = make_workers(cfg)
    scramble(workers.actor.module, seed=3)
    rollout = VLLMRollout(cfg, workers, sleep=True)
    syncs = []
    sync = rollout.sync_weights
    rollout.sync_weights = lambda actor: (syncs.append(1), sync(actor))
    try:
        batch = prompt_batch(workers.tokenizer, PROMPTS)
        batch["index"], batch["row"] = list(range(len(batch))), [{}] * len(batch)
        torch.manual_seed(0)
        out, sampled = _episodes(cfg, workers, rollout, batch, max_turns=3)
        assert len(sampled) == 3 and syncs == []                 # no wake-up (a full weight sync) per turn
        assert rollout.asleep and rollout.llm.llm_engine.is_sleeping()
    finally:
        rollout.close()
