"""scripts/tool_call_warmup.py: its conversations are the ids the agent endpoint records for the same episode
(built here through the endpoint's own `Transcript`), its labels are exactly the model's turns, no
conversation offers a calculator, and a run on a tiny model writes a folder the hf worker loads."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

from nanoverl_core.agents import assistant_message
from nanoverl_core.agents.transcript import Choice, Transcript, hermes_messages
from nanoverl_hf.tiny import CHATML, PRINTABLE, build_tiny_model

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("tool_call_warmup", ROOT / "scripts" / "tool_call_warmup.py")
warmup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(warmup)


def tokenizer_and_folder(tmp_path):
    from transformers import AutoTokenizer

    folder = build_tiny_model(tmp_path / "model", alphabet=PRINTABLE, hidden=32, max_positions=2048,
                              chat_template=CHATML)
    return AutoTokenizer.from_pretrained(folder), folder


def endpoint_episode(tokenizer, tools, messages, stop):
    """The row (ids, model mask) the endpoint's Transcript builds when the model samples the conversation's two
    turns and the agent answers the call with the tool's message, as calculator_agent.py does."""
    row = Transcript(budget=10_000)
    row.chat_prompt(tokenizer, messages[:1], tools, "hermes", [stop])

    def sample(text):
        ids = tokenizer.encode(text, add_special_tokens=False) + [stop]
        reply, malformed = assistant_message(text, tools, "call")
        assert malformed == 0
        row.choices = [Choice(ids=ids, log_probs=[0.0] * len(ids), text=text, message=reply)]
        return reply

    reply = sample(hermes_messages(messages[1:2])[0]["content"])
    assert reply["tool_calls"][0]["function"]["name"] == messages[1]["tool_calls"][0]["function"]["name"]
    result = {**messages[2], "tool_call_id": reply["tool_calls"][0]["id"]}
    row.chat_prompt(tokenizer, [messages[0], reply, result], tools, "hermes", [stop])
    sample(messages[3]["content"])
    row.commit()
    return row.prompt + row.tokens, [False] * len(row.prompt) + row.model


def test_conversations_are_the_endpoints_episode_and_label_the_models_turns(tmp_path):
    tokenizer, _ = tokenizer_and_folder(tmp_path)
    stop = tokenizer.eos_token_id
    rng = random.Random(3)
    for _ in range(12):
        tools, messages = warmup.conversation(rng)
        ids, labels = warmup.encode(tokenizer, tools, messages, stop)
        row_ids, model = endpoint_episode(tokenizer, tools, messages, stop)
        assert ids == row_ids
        assert [label != -100 for label in labels] == model
        assert [label for label in labels if label != -100] == [i for i, m in zip(ids, model) if m]


def test_no_conversation_offers_a_calculator_or_asks_a_number_question():
    rng = random.Random(0)
    names = set()
    for _ in range(300):
        tools, messages = warmup.conversation(rng)
        names |= {t["function"]["name"] for t in tools}
        assert not any(op in messages[0]["content"] for op in (" + ", " - ", " * ", " / "))
    assert len(names) == 14 and not any("calc" in n or "math" in n for n in names)


def test_a_run_writes_a_model_folder_the_worker_loads(tmp_path):
    from nanoverl_core.config.schema import Config, ModelConfig
    from nanoverl_hf.models import load_policy, resolve_source

    _, folder = tokenizer_and_folder(tmp_path)
    out = tmp_path / "warm"
    warmup.main([str(folder), str(out), "--examples", "4", "--batch-size", "2", "--threads", "1"])
    assert (out / "config.json").is_file() and any(out.glob("*.safetensors"))
    config = Config(model=ModelConfig(path=str(out), dtype="float32"))
    source = resolve_source(config.model)
    assert source.has_weights
    model = load_policy(config, source)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] is not None
    assert model.config.vocab_size == len(PRINTABLE) + 3


def test_a_missing_model_is_one_error_line(tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "tool_call_warmup.py"), str(tmp_path / "no.gguf"),
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 2 and not (tmp_path / "out").exists()
    assert run.stderr.splitlines() == [f"error: the model {str(tmp_path / 'no.gguf')!r} does not exist; download the "
                                       "GGUF file first (see the nanoverl-hf README) or fix the path"]
