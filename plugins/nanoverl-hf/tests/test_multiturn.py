"""Multi-turn episodes through the `hf` rollout: the trained ids are the sampler's, bit for bit, under a chat
template that rewrites earlier turns; tool prompts; the multi-turn copy task learns."""

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
