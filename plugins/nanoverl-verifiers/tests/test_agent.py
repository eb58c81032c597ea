"""The agent `verifiers` in real agent worker processes against nanoverl's real endpoint on 127.0.0.1: the
environments of fixture_envs/ (written with verifiers' own API) run their own rollouts through verifiers'
`Environment.run_rollout` and `OpenAIChatCompletionsClient`, and their rubrics' rewards and metrics reach the
rows. How a row becomes verifiers' input, and which environments are refused, without a model."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("fastapi")

import torch  # noqa: E402

from conftest import TOOL_ENV, records  # noqa: E402
from nanoverl_core import RLBatch, load_config, load_registry  # noqa: E402
from nanoverl_core.agents import AgentRollout, AgentSource  # noqa: E402
from nanoverl_core.agents.transcript import render_chat  # noqa: E402
from nanoverl_core.rollout import SamplingParams, responses_to_batch  # noqa: E402
from nanoverl_verifiers.agent import rollout_input  # noqa: E402
from nanoverl_verifiers.loading import environment  # noqa: E402

SOURCE = AgentSource(name="verifiers", ref="nanoverl_verifiers.agent:run_environment")


def make_config(model, *overrides: str):
    return load_config(None, [f"model.path={model}", "worker.name=hf", "rollout.name=hf", "trainer.device=cpu",
                              "data.source=verifiers", "data.batch_size=2", "agent.name=verifiers",
                              "agent.workers=2", "agent.timeout_s=60", "rollout.max_new_tokens=48", *overrides],
                       registry=load_registry())


def rows_batch(tokenizer, rows: list[dict]) -> RLBatch:
    """The rows as the loader hands them to the rollout (the agent reads `row`; the prompt ids are replaced by
    the first call's)."""
    ids = [tokenizer.encode("q", add_special_tokens=False)] * len(rows)
    batch = RLBatch({"prompts": torch.tensor(ids), "prompt_mask": torch.ones(len(rows), len(ids[0]), dtype=torch.long)})
    batch["index"], batch["row"] = list(range(len(rows))), rows
    return batch


def test_single_turn_rows_carry_the_rubrics_reward_on_what_the_model_sampled(chat_model, tmp_path):
    """vf-arith (a SingleTurnEnv loaded by its id) on the tiny hf model, its own dataset rows: each row's
    prompt is verifiers' formatting of the question (system prompt, user message) rendered once; the rubric,
    which ran in the agent workers, scored exactly the text the model sampled for that row; the row's reward
    is the rubric's (1 for the answer + 0.005 per character) and its metrics arrive as info numbers."""
    from nanoverl_hf.rollout import HFRollout
    from nanoverl_hf.workers import make_workers

    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    config = make_config(chat_model, "agent.verifiers.env_id=vf-arith",
                         f"agent.verifiers.env_args.record_dir={seen_dir}", "agent.score_answer=false")
    workers = make_workers(config)
    tok = workers.tokenizer
    rows = environment("vf-arith", {"record_dir": str(seen_dir)}).get_dataset(4).to_list()
    rollout = AgentRollout(HFRollout(config, workers), SOURCE, config, tok)
    try:
        torch.manual_seed(0)
        out = rollout.generate(rows_batch(tok, rows), SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    seen = {r["example_id"]: r for r in records(seen_dir)}
    assert sorted(seen) == [row["example_id"] for row in rows] == [0, 1, 2, 3]
    assert len({r["pid"] for r in seen.values()} - {os.getpid()}) == 2        # scored in the two agent workers
    for i, row in enumerate(rows):
        text, info, record = out["final_text"][i], out["episode_info"][i], seen[row["example_id"]]
        assert out["episode_error"][i] is None and int(out["num_turns"][i]) == 1
        assert row["prompt"] == [{"role": "system", "content": "Add the two numbers."},
                                 {"role": "user", "content": row["question"]}]
        prompt = out["prompts"][i][out["prompt_mask"][i].bool()].tolist()
        assert prompt == tok.encode(render_chat(tok, row["prompt"], [], "hermes"), add_special_tokens=False)
        assert record["prompt"] == row["prompt"] and record["answer"] == row["answer"]
        assert record["completion"] == (text or None)          # an empty reply is verifiers' EmptyModelResponseError
        expected = float(row["answer"] in text) + 0.005 * len(text)
        assert float(out["turn_rewards"][i].sum()) == pytest.approx(expected, abs=1e-6)
        assert info["vf_reward"] == pytest.approx(expected) and info["vf_chars"] == len(text)
        assert info["vf_length"] == pytest.approx(0.005 * len(text))
        assert info["vf_correct"] == float(row["answer"] in text)
        assert info["vf_num_turns"] == float(bool(text)) and info["vf_error"] == float(not text)
        assert info["calls"] == 1.0
    assert any(out["final_text"])


class Scripted:
    """An engine that samples fixed text: a call of the tool `add` until the prompt holds a tool result, then
    "7". Only the sampler is replaced (a random model does not write tool calls); the endpoint, the merging
    of calls into one row, verifiers' ToolEnv loop, its tool and its rubric are the real ones."""

    CALL = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    returns_log_probs = False

    def __init__(self, tokenizer):
        self.tok, self.eos_token_ids, self.prompts = tokenizer, [tokenizer.eos_token_id], []

    def generate(self, batch, params):
        replies = []
        for ids, mask in zip(batch["prompts"], batch["prompt_mask"]):
            text = self.tok.decode(ids[mask.bool()].tolist())
            self.prompts.append(text)
            reply = "7" if "<|tool|>" in text else self.CALL
            replies.append(self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id])
        return responses_to_batch(replies, eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id,
                                  max_new_tokens=params.max_new_tokens)

    def sync_weights(self, actor):
        pass

    def close(self):
        pass


def test_a_tool_environment_runs_its_tool_on_the_models_tool_call(chat_model, tmp_path):
    """ToolEnv (loaded as "file.py:function") with a scripted sampler: the tool schema verifiers built from the
    Python function reaches the model's prompt, the model's `<tool_call>` comes back to verifiers as an OpenAI
    tool call, verifiers runs the tool (it records its arguments) and sends its result, and that call merges
    into the same row: model turn, tool result, model turn. The rubric's reward (1 for the reply "7", the answer
    of one row) and ToolEnv's own metrics (add_calls, total_tool_calls) reach each row."""
    from transformers import AutoTokenizer

    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    config = make_config(chat_model, f"agent.verifiers.env_id={TOOL_ENV}",
                         f"agent.verifiers.env_args.record_dir={seen_dir}", "agent.score_answer=false",
                         "rollout.max_new_tokens=256")
    tok = AutoTokenizer.from_pretrained(chat_model)
    rows = environment(TOOL_ENV, {"record_dir": str(seen_dir)}).get_dataset().to_list()
    engine = Scripted(tok)
    rollout = AgentRollout(engine, SOURCE, config, tok)
    try:
        out = rollout.generate(rows_batch(tok, rows), SamplingParams(max_new_tokens=256, temperature=1.0))
    finally:
        rollout.close()
    calls = [json.loads(line) for line in (seen_dir / "tool_calls.jsonl").read_text().splitlines()]
    assert calls == [{"a": 3, "b": 4}] * len(rows)                              # the tool ran, once per row
    first = [p for p in engine.prompts if "<|tool|>" not in p]
    assert len(first) == len(rows) and all('"name": "add"' in p and "Add two integers." in p for p in first)
    for i, row in enumerate(rows):
        turns = out["episode"][i]
        assert [t["role"] for t in turns] == ["model", "environment", "model"], out["episode_error"][i]
        assert [t["text"] for t in turns if t["role"] == "model"] == [Scripted.CALL, "7"]
        assert "<|tool|>7<eos>" in turns[1]["text"]
        reward = float(row["answer"] == "7")
        assert float(out["turn_rewards"][i].sum()) == reward
        info = out["episode_info"][i]
        assert (info["vf_correct"], info["vf_add_calls"], info["vf_total_tool_calls"], info["vf_num_turns"],
                info["vf_error"], info["calls"]) == (reward, 1.0, 1.0, 2.0, 0.0, 2.0)
    assert sorted(r["answer"] for r in rows) == ["1", "3", "5", "7"]


def test_a_row_becomes_verifiers_rollout_input_as_verifiers_formats_a_dataset():
    env = SimpleNamespace(system_prompt="Be brief.", few_shot=[{"role": "user", "content": "1+1"},
                                                               {"role": "assistant", "content": "2"}])
    question = rollout_input({"question": "2+2", "answer": "4", "info": {"k": 1}, "level": 3, "__file__": "f.jsonl",
                              "__row__": 5}, env)
    assert question == {"question": "2+2", "answer": "4", "info": {"k": 1}, "level": 3, "example_id": 5,
                        "prompt": [{"role": "system", "content": "Be brief."}, *env.few_shot,
                                   {"role": "user", "content": "2+2"}]}
    text = rollout_input({"prompt": "2+2", "example_id": 9}, env)
    assert text["prompt"] == question["prompt"] and text["example_id"] == 9
    chat = rollout_input({"prompt": [{"role": "user", "content": "hi"}], "task": "t"}, env)
    assert chat == {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                    "task": "t", "example_id": 0}
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]
    assert rollout_input({"prompt": own}, env)["prompt"] == own
    with pytest.raises(ValueError, match="the row has no prompt"):
        rollout_input({"problem": "x"}, env)


def test_environments_one_rollout_per_agent_cannot_run_are_refused(tmp_path):
    module = tmp_path / "envs.py"
    module.write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "DATA = Dataset.from_list([{'question': 'q', 'answer': 'a'}])\n"
        "def grouped():\n"
        "    def best_of_group(completions, answers) -> list[float]:\n"
        "        return [1.0 for _ in completions]\n"
        "    return vf.SingleTurnEnv(dataset=DATA, rubric=vf.Rubric(funcs=[best_of_group]))\n"
        "def not_an_env(size=1):\n"
        "    return {'size': size}\n")
    with pytest.raises(ValueError, match="group reward functions"):
        environment(f"{module}:grouped", {})
    with pytest.raises(ValueError, match="returned dict, not a verifiers Environment"):
        environment(f"{module}:not_an_env", {"size": 2})
    with pytest.raises(ValueError, match=r"takes no argument 'sise'; did you mean 'size'"):
        environment(f"{module}:not_an_env", {"sise": 2})


def test_the_agents_check_config_builds_the_environment_whatever_the_data_source(tmp_path):
    """`run_environment.check_config(config)` (the optional attribute a registered agent may carry) builds the
    environment and turns a loader that refuses its arguments into one ConfigError; the data source
    `verifiers` runs it before any model loads, and so would the core's load_agent (see INTEGRATE)."""
    from nanoverl_core.errors import ConfigError
    from nanoverl_verifiers.agent import run_environment

    rows = tmp_path / "train.jsonl"
    rows.write_text('{"question": "1+2=", "answer": "3"}\n')
    config = load_config(None, [f"data.train_files=[{rows}]", "data.prompt_key=question", "agent.name=verifiers",
                                "agent.verifiers.env_id=vf-arith", "agent.verifiers.env_args.num_examples=0"],
                         registry=load_registry())
    with pytest.raises(ConfigError) as info:
        run_environment.check_config(config)
    assert str(info.value) == ("[agent.verifiers] env_id = 'vf-arith': the environment does not build here "
                               "(RuntimeError: Failed to load environment 'vf-arith': num_examples must be at least "
                               "1, got 0); fix agent.verifiers.env_args or the environment")
