"""Multi-turn episodes through the `hf` rollout: the trained ids are the sampler's, bit for bit, under a chat
template that rewrites earlier turns; the KV cache kept across turns samples what re-prefilling samples; tool
prompts; the multi-turn copy task learns."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import prompt_batch
from nanoverl_core.env import EnvStep, EpisodeRollout, InProcess, with_tools
from nanoverl_core.env.render import RenderError, render_answer, template_messages
from nanoverl_core.rollout import SamplingParams
from nanoverl_hf.rollout import HFRollout
from nanoverl_hf.tiny import build_tiny_model
from nanoverl_hf.workers import make_workers

REPO = Path(__file__).resolve().parents[3]

# A template that rewrites earlier turns, as Qwen3's drops earlier <think> blocks: an assistant message that
# is not the last one keeps only what follows its last "|". Tool results render as "|<content>=".
REWRITING = ("{%- for m in messages -%}"
             "{%- if m.role == 'user' -%}:{{ m.content }}="
             "{%- elif m.role == 'tool' -%}|{{ m.content }}="
             "{%- elif loop.last -%}{{ m.content }}<eos>"
             "{%- else -%}{{ m.content.split('|')[-1] }}<eos>{%- endif -%}"
             "{%- endfor -%}")


class Recorder:
    def __init__(self, engine):
        self.engine, self.sampled = engine, []
        self.returns_log_probs = False
        self.module = engine.module

    def generate(self, batch, params):
        out = self.engine.generate(batch, params)
        self.sampled.append([row[:int(n)].tolist() for row, n in zip(out["responses"], out["response_mask"].sum(-1))])
        return out

    def sync_weights(self, actor):
        self.engine.sync_weights(actor)

    def close(self):
        self.engine.close()


class ToolAnswers:
    def step(self, turn):
        return EnvStep(observation=[{"role": "tool", "content": "7"}], reward=1.0)


@pytest.fixture(scope="module")
def rewriting_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("rewriting") / "model", alphabet="0123456789=|:",
                            chat_template=REWRITING)


def test_hf_episode_tokens_are_the_samplers_under_a_template_that_rewrites_earlier_turns(rewriting_dir,
                                                                                           make_config):
    config = make_config(rewriting_dir, "environment.name=echo", "environment.max_turns=3",
                         "environment.max_turn_tokens=5", "rollout.max_new_tokens=24")
    workers = make_workers(config)
    tok = workers.tokenizer
    engine = Recorder(HFRollout(config, workers))
    rollout = EpisodeRollout(engine, InProcess(lambda row: ToolAnswers(), None, 0), config, tok, name="echo")
    batch = prompt_batch(tok, [":12=", ":345=", ":6=", ":78="] * 2)
    batch["index"], batch["row"] = list(range(8)), [{}] * 8
    torch.manual_seed(0)
    out = rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    answer = tok.encode("|7=", add_special_tokens=False)
    rewritten = 0
    for row in range(8):
        live = [turns for turns in engine.sampled]                   # every episode runs 3 turns (none is done)
        turns = [call[row] for call in live]
        expected = turns[0] + answer + turns[1] + answer + turns[2]
        n = int(out["response_mask"][row].sum())
        assert out["responses"][row, :n].tolist() == expected          # the sampler's ids, bit for bit
        assert out["model_mask"][row, :n].tolist() == [1.0] * len(turns[0]) + [0.0] * len(answer) + \
            [1.0] * len(turns[1]) + [0.0] * len(answer) + [1.0] * len(turns[2])
        # what a trainer that re-renders the conversation would train on instead
        messages = [{"role": "user", "content": tok.decode(batch["prompts"][row][batch["prompt_mask"][row].bool()])
                     .strip(":=")}]
        for i, ids in enumerate(turns):
            messages.append({"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)})
            if i < 2:
                messages.append({"role": "tool", "content": "7"})
        rerendered = tok.apply_chat_template(messages, tokenize=True)
        rerendered = rerendered["input_ids"] if isinstance(rerendered, dict) else list(rerendered)
        rewritten += rerendered[-n:] != expected
    assert rewritten >= 2, "the template should have rewritten some earlier turns"


class AnswersFor:
    """Answers every turn with "|7=" and ends the episode after the row's "turns" turns."""

    def __init__(self, row):
        self.turns = row["turns"]

    def step(self, turn):
        return EnvStep(observation=[{"role": "tool", "content": "7"}], reward=1.0, done=turn.index + 1 >= self.turns)


def test_hf_episodes_keep_the_kv_cache_across_turns_and_sample_the_ids_a_full_prefill_samples(rewriting_dir,
                                                                                               make_config):
    """The rollout's kept KV cache against `[rollout.hf] turn_cache = false` (each turn's prompt prefilled whole)
    on the same module: the same ids, masks and rewards for the same seed, with episodes ending after 1 to 4
    turns (rows drop out between turns) and micro-batches of 3 that regroup the rows every turn; no forward of
    the kept-cache run is fed more columns than the prompts or a turn's new tokens; nothing is kept after."""
    overrides = ("environment.name=answers", "environment.max_turns=4", "environment.max_turn_tokens=5",
                 "rollout.max_new_tokens=40", "rollout.micro_batch_size=3")
    config = make_config(rewriting_dir, *overrides)
    workers = make_workers(config)
    tok = workers.tokenizer
    engine = HFRollout(config, workers)
    whole = HFRollout(make_config(rewriting_dir, *overrides, "rollout.hf.turn_cache=false"), workers)
    assert engine.module is whole.module
    batch = prompt_batch(tok, [":12=", ":345=", ":6=", ":78="] * 2)
    batch["index"], batch["row"] = list(range(8)), [{"turns": 1 + i % 4} for i in range(8)]
    answer = tok.encode("|7=", add_special_tokens=False)
    fed: list[int] = []
    hook = engine.module.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)   # columns fed
    outs, widest = {}, {}
    try:
        for name, rollout_engine in (("kept", engine), ("prefilled", whole)):
            rollout = EpisodeRollout(rollout_engine, InProcess(AnswersFor, None, 0), config, tok, name="answers")
            fed.clear()
            torch.manual_seed(0)
            outs[name] = rollout.generate(batch, SamplingParams(max_new_tokens=40, temperature=1.0))
            widest[name] = max(fed)
    finally:
        hook.remove()
    kept, prefilled = outs["kept"], outs["prefilled"]
    assert kept["num_turns"].tolist() == [1, 2, 3, 4] * 2 and not kept["truncated"].any()
    assert sorted(kept.tensors) == sorted(prefilled.tensors)
    for key in kept.tensors:                       # responses, response_mask, model_mask, turn_rewards, ...
        assert torch.equal(kept[key], prefilled[key]), key
    assert kept["model_mask"].sum() < kept["response_mask"].sum()    # the environment's answers are in the rows
    assert widest["kept"] <= max(batch["prompts"].shape[1], 1 + len(answer)) < widest["prefilled"]
    assert engine._kept is None and whole._kept is None


def test_a_kept_cache_gives_the_logits_of_a_prefill_of_the_whole_prompt(rewriting_dir, make_config):
    """The second turn's cache built from the first call's kept caches, rows of different lengths re-padded:
    the logits of the columns left to prefill equal those of a forward over the whole prompt (float rounding)."""
    config = make_config(rewriting_dir, "rollout.max_new_tokens=6")
    workers = make_workers(config)
    tok = workers.tokenizer
    engine = HFRollout(config, workers)
    batch = prompt_batch(tok, [":12=", ":345=", ":6="])
    batch["episode_key"] = torch.tensor([7, 8, 9])
    answer = tok.encode("|7=", add_special_tokens=False)
    with engine.turn_cache():
        torch.manual_seed(0)
        out = engine.generate(batch, SamplingParams(max_new_tokens=6, temperature=1.0))
        contexts = [prompt[mask.bool()].tolist() + response[:int(n)].tolist() + answer
                    for prompt, mask, response, n in zip(batch["prompts"], batch["prompt_mask"], out["responses"],
                                                         out["response_mask"].sum(-1))]
        turn = prompt_batch(tok, [tok.decode(c) for c in contexts]).index([1, 2, 0])   # the rows in another order
        ids, mask = turn["prompts"], turn["prompt_mask"]
        assert [row[m.bool()].tolist() for row, m in zip(ids, mask)] == [contexts[1], contexts[2], contexts[0]]
        cache = engine._kept_cache([8, 9, 7], ids, mask)
    (name, kept), = cache.items()
    cached = kept.get_seq_length()
    assert 0 < cached and ids.shape[1] - cached <= 1 + len(answer)        # only the new tokens are left to feed
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        whole = engine.module(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
        rest = engine.module(input_ids=ids[:, cached:], attention_mask=mask, position_ids=position_ids[:, cached:],
                             **{name: kept}).logits
    real = mask[:, cached:].bool()
    torch.testing.assert_close(rest[real], whole[:, cached:][real], rtol=1e-5, atol=1e-5)


def test_an_answer_is_rendered_once_with_the_templates_glue():
    from nanoverl_hf.tiny import build_tokenizer

    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok = build_tokenizer("abc", chatml)
    text = template_messages(tok, [{"role": "tool", "content": "7"}], ["<|im_end|>"])
    assert text == "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"   # the newline after the model's stop
    ids, text = render_answer(build_tokenizer("0123456789=|:", REWRITING), [{"role": "tool", "content": "7"}], [2])
    assert text == "|7="
    with pytest.raises(RenderError, match="a list of chat messages"):
        render_answer(tok, [{"content": "no role"}], [2])
    drops_last = "{% for m in messages %}{% if not loop.last %}{{ m.content }}{% endif %}{% endfor %}"
    with pytest.raises(RenderError, match="renders an assistant turn differently"):
        render_answer(build_tokenizer("abc", drops_last), [{"role": "tool", "content": "7"}], [2])


def test_prompts_get_the_tools_through_the_template_or_the_tag_format():
    from nanoverl_core.builtins.environments import calculate
    from nanoverl_hf.tiny import build_tokenizer

    messages = [{"role": "user", "content": "What is 12 * 7?"}]
    plain = build_tokenizer("abc", "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    rendered = with_tools(messages, plain, [calculate])          # no tool format: the tag instructions
    assert rendered.startswith("[system] You can call tools.") and "<tool_call>" in rendered
    assert json.dumps({"name": "calculate", "description": "Evaluate an arithmetic expression exactly.",
                       "parameters": {"type": "object", "properties": {"expression": {
                           "type": "string", "description": 'numbers with + - * / and parentheses, for example '
                                                            '"37 * (12 - 5)"'}}, "required": ["expression"]},
                       "return": {"type": "string"}}) in rendered
    native = build_tokenizer("abc", "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
                                    "{% for m in messages %}{{ m.content }}{% endfor %}")
    rendered = with_tools(messages, native, [calculate])         # the template's own tool format
    assert rendered.startswith('<tools>[{"type": "function", "function": {"name": "calculate"')
    assert "You can call tools" not in rendered


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_grpo") is None, reason="needs nanoverl-grpo")
def test_the_multiturn_twin_of_the_tiny_copy_task_learns(tmp_path):
    """examples/configs/tiny_copy_turns.toml as a user runs it: two turns per episode, the environment's
    "=" between them; measured (seed 0): val 0.56 at step 150, 0.996 at 200, 1.0 from 250."""
    run = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", "--config", "examples/configs/tiny_copy_turns.toml",
                          f"trainer.output_dir={tmp_path}", "trainer.save_every=0", "trainer.val_every=100",
                          "trainer.progress=none"], cwd=REPO, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["val/reward/mean"] >= 0.9, rows[-1]
    assert rows[-1]["episode/turns/mean"] == 2.0 and rows[-1]["episode/env_tokens/mean"] == 1.0


@pytest.mark.skipif(importlib.util.find_spec("nanoverl_grpo") is None, reason="needs nanoverl-grpo")
def test_the_tiny_model_learns_a_tool_from_an_environment_file(tmp_path):
    """examples/configs/tiny_tool.toml as a user runs it: the environment and its tool are one file
    (environment.file, no plugin), run in the environment workers; from random weights the model learns
    to dial the code and read the phone book's number back. Measured: greedy validation >= 0.99 from step
    200 on seeds 0-4 (docs/multiturn.md); validation codes are never trained on, so only tool use scores."""
    run = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", "--config", "examples/configs/tiny_tool.toml",
                          f"trainer.output_dir={tmp_path}", "trainer.total_steps=250", "trainer.save_every=0",
                          "trainer.val_every=250", "trainer.progress=none"], cwd=REPO, capture_output=True, text=True,
                         timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["val/reward/mean"] >= 0.9 and last["val/episode/dialed_right/mean"] >= 0.9, last
    assert last["val/episode/turns/mean"] == 2.0 and last["val/rollout/truncated_frac"] <= 0.1, last
