"""Agents through the OpenAI-compatible endpoint with the `hf` engine: real `openai` clients in real agent
worker processes against the real endpoint on 127.0.0.1. The trained ids are the sampled ids, bit for bit,
over merged calls; every fault ends in its row with its kind; a run killed mid-step resumes exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from conftest import prompt_batch  # noqa: E402
from nanoverl_core import RLBatch  # noqa: E402
from nanoverl_core.agents import AgentRollout, AgentSource, assistant_message, render_chat  # noqa: E402
from nanoverl_core.errors import EpisodeError  # noqa: E402
from nanoverl_core.processes import descendants  # noqa: E402
from nanoverl_core.rollout import SamplingParams  # noqa: E402
from nanoverl_hf.rollout import HFRollout  # noqa: E402
from nanoverl_hf.tiny import CHATML, PRINTABLE, build_tiny_model  # noqa: E402
from nanoverl_hf.workers import make_workers  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def agent_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("agent_model") / "model", alphabet=PRINTABLE, hidden=32,
                            max_positions=1024, chat_template=CHATML)


class Recorder:
    """The hf engine, keeping what it sampled for each prompt (token ids in, token ids out)."""

    def __init__(self, engine):
        self.engine, self.sampled = engine, {}
        self.returns_log_probs, self.module, self.eos_token_ids = False, engine.module, engine.eos_token_ids

    def generate(self, batch, params):
        out = self.engine.generate(batch, params)
        for ids, mask, resp, n in zip(batch["prompts"], batch["prompt_mask"], out["responses"],
                                      out["response_mask"].sum(-1)):
            self.sampled.setdefault(tuple(ids[mask.bool()].tolist()), []).append(resp[:int(n)].tolist())
        return out

    def sync_weights(self, actor):
        self.engine.sync_weights(actor)

    def turn_cache(self):
        return self.engine.turn_cache()

    def close(self):
        self.engine.close()


def rollout_for(make_config, model, tmp_path, code: str, *overrides: str, record: bool = False):
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(code))
    config = make_config(model, f"agent.file={path}", "agent.function=agent", "rollout.max_new_tokens=48",
                         "agent.timeout_s=20", "agent.workers=2", *overrides)
    workers = make_workers(config)
    engine = HFRollout(config, workers)
    engine = Recorder(engine) if record else engine
    return AgentRollout(engine, AgentSource(file=str(path), function="agent"), config, workers.tokenizer), workers


def rows_batch(tokenizer, rows: list[dict]) -> RLBatch:
    batch = prompt_batch(tokenizer, ["q"] * len(rows))
    batch["index"], batch["row"] = list(range(len(rows))), rows
    return batch


MERGING = """
    import json, pathlib
    TOOLS = [{"type": "function", "function": {"name": "look", "description": "Look it up.",
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]

    def agent(row, client):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["q"]}]
        seen = []
        for turn in range(3):
            reply = client.chat.completions.create(model="any", messages=messages, tools=TOOLS, max_tokens=6)
            message = reply.choices[0].message
            seen.append(message.content)
            messages.append(message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": "x", "content": f"r{turn}"} if turn == 0 else
                            {"role": "user", "content": "more"})
        pathlib.Path(row["out"]).write_text(json.dumps(seen))
        return 0.5
"""


def test_merged_calls_train_the_sampled_ids_bit_for_bit(agent_model, make_config, tmp_path):
    """Three calls, each extending the last with the reply, then a tool or a user message: one row whose model
    tokens are the sampled ids of each call in order, whose other tokens are the new messages rendered once, whose
    prompt is the first call's rendering (tools in the Hermes block); the agent read what the row holds."""
    rollout, workers = rollout_for(make_config, agent_model, tmp_path, MERGING, "rollout.max_new_tokens=96",
                                   record=True)
    tok = workers.tokenizer
    rows = [{"q": f"what is {i}?", "out": str(tmp_path / f"seen{i}.json")} for i in range(4)]
    try:
        torch.manual_seed(0)
        out = rollout.generate(rows_batch(tok, rows), SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    assert rollout.tool_format == "hermes"          # the template ignores tools
    glue = "\n"                                     # what CHATML writes after an assistant turn's <eos>
    for i, row in enumerate(rows):
        prompt = out["prompts"][i][out["prompt_mask"][i].bool()].tolist()
        tools = json.loads(json.dumps([{"type": "function", "function": {
            "name": "look", "description": "Look it up.", "parameters": {"type": "object", "properties": {"q": {
                "type": "string"}}}}}]))
        first = render_chat(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["q"]}],
                            tools, "hermes")
        assert prompt == tok.encode(first, add_special_tokens=False)
        n = int(out["response_mask"][i].sum())
        ids, model = out["responses"][i, :n].tolist(), out["model_mask"][i, :n].tolist()
        context, expected, expected_mask = list(prompt), [], []
        answers = [f"{glue}<|tool|>r0<eos>\n<|assistant|>", f"{glue}<|user|>more<eos>\n<|assistant|>"]
        for turn in range(3):
            sampled = rollout.engine.sampled[tuple(context + expected)][0]
            expected += sampled
            expected_mask += [1.0] * len(sampled)
            if turn < 2:
                env = tok.encode(answers[turn], add_special_tokens=False)
                expected += env
                expected_mask += [0.0] * len(env)
        assert ids == expected and model == expected_mask
        seen = json.loads(Path(row["out"]).read_text())
        model_turns = [t for t in out["episode"][i] if t["role"] == "model"]
        assert [t["text"] for t in model_turns] == [s or "" for s in seen]
        assert float(out["turn_rewards"][i].sum()) == 0.5 and int(out["num_turns"][i]) == 3
    assert not out["episode_failed"].any() and all(info["calls"] == 3 for info in out["episode_info"])


FAULTS = """
    import os, threading, time

    def agent(row, client):
        mode = row["mode"]
        ask = lambda messages, **kw: client.chat.completions.create(model="m", messages=messages, max_tokens=4, **kw)
        first = [{"role": "user", "content": "hi"}]
        if mode == "raise":
            raise ValueError("the agent's own bug")
        if mode == "hang":
            time.sleep(60)
        if mode == "none":
            return 1.0
        if mode == "wrong":
            return "yes"
        reply = ask(first)
        if mode == "flood":
            messages = first
            for _ in range(3):
                messages = messages + [reply.choices[0].message.model_dump(exclude_none=True),
                                       {"role": "user", "content": "go"}]
                reply = ask(messages)
        if mode == "concurrent":
            import concurrent.futures, openai

            follow = first + [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]

            def either(_):                  # the same next call twice at once: one merges, one is refused
                try:
                    ask(follow)
                except openai.BadRequestError:
                    pass
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                list(pool.map(either, range(2)))
        if mode == "refused":
            ask(first, n=99)
        if mode == "late":
            threading.Thread(target=lambda: (time.sleep(1), ask(first))).start()
        return 1.0
"""
MODES = ["ok", "raise", "hang", "none", "wrong", "flood", "concurrent", "refused", "late", "ok"]
KINDS = {"ok": None, "raise": "raised", "hang": "timeout", "none": "no_calls", "wrong": "invalid", "flood": "flood",
         "concurrent": "concurrent", "refused": "refused", "late": "late"}


def test_every_agent_fault_ends_in_its_row_with_its_kind_and_nothing_is_left_running(agent_model, make_config,
                                                                                       tmp_path):
    """agent.on_error=zero: each faulty agent's row scores 0 with its kind (in episode_error and as
    episode/error_<kind>), the good rows keep their reward, the hanging agent's worker is replaced, and the
    next batch runs on the same endpoint."""
    rollout, workers = rollout_for(make_config, agent_model, tmp_path, FAULTS, "agent.on_error=zero",
                                   "agent.timeout_s=10", "agent.max_calls=3", "rollout.max_new_tokens=96",
                                   "agent.batch_window_ms=300")
    rows = [{"mode": m} for m in MODES]
    batch = rows_batch(workers.tokenizer, rows)
    try:
        out = rollout.generate(batch, SamplingParams(max_new_tokens=48, temperature=1.0))
        for i, mode in enumerate(MODES):
            error = out["episode_error"][i]
            if KINDS[mode] is None:
                assert error is None and float(out["turn_rewards"][i].sum()) == 1.0, error
            else:
                assert error.startswith(f"{KINDS[mode]}: agent ") and f"data row {i}" in error, (mode, error)
                assert out["episode_info"][i][f"error_{KINDS[mode]}"] == 1.0
                assert float(out["turn_rewards"][i].sum()) == 0.0 and bool(out["episode_failed"][i])
        assert len(descendants()) == 1           # the worker holding the hung agent's thread was killed
        again = rollout.generate(rows_batch(workers.tokenizer, [{"mode": "ok"}] * 3),
                                 SamplingParams(max_new_tokens=48, temperature=1.0))
        assert not again["episode_failed"].any() and len(descendants()) == 2, again["episode_error"]   # and replaced
    finally:
        rollout.close()
    assert descendants() == []


def test_an_agent_that_kills_its_worker_costs_that_workers_rows_and_the_run_goes_on(agent_model, make_config,
                                                                                   tmp_path):
    code = """
        import os
        def agent(row, client):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3)
            if row["crash"]:
                os._exit(3)
            return 1.0
    """
    rollout, workers = rollout_for(make_config, agent_model, tmp_path, code, "agent.on_error=zero", "agent.workers=2")
    try:
        out = rollout.generate(rows_batch(workers.tokenizer, [{"crash": True}, {"crash": False}]),
                               SamplingParams(max_new_tokens=48, temperature=1.0))
        assert out["episode_error"][0].startswith("crash: ") and "exited with status 3" in out["episode_error"][0]
        assert out["episode_error"][1] is None       # the other worker's agent
        again = rollout.generate(rows_batch(workers.tokenizer, [{"crash": False}] * 2),
                                 SamplingParams(max_new_tokens=48, temperature=1.0))
        assert not again["episode_failed"].any()
    finally:
        rollout.close()


def test_on_error_raise_stops_with_one_line_naming_the_agent_row_and_kind(agent_model, make_config, tmp_path):
    rollout, workers = rollout_for(make_config, agent_model, tmp_path, FAULTS)
    try:
        with pytest.raises(EpisodeError) as info:
            rollout.generate(rows_batch(workers.tokenizer, [{"mode": "ok"}, {"mode": "raise"}]),
                             SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    message = str(info.value)
    assert "\n" not in message and "agent.py:agent" in message and "data row 1" in message
    assert "raised: raised ValueError: the agent's own bug" in message and "agent.on_error=zero" in message


def test_async_agents_programs_and_openai_errors(agent_model, make_config, tmp_path):
    """An async agent on AsyncOpenAI; the endpoint's errors are OpenAI's (a wrong key is AuthenticationError,
    an unknown episode NotFoundError) and cost nothing when the agent handles them outside its episode."""
    code = """
        import json, pathlib, openai

        async def agent(row, client):
            wrong = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
            other = openai.AsyncOpenAI(base_url=str(client.base_url).replace("/e/", "/e/x"), api_key=client.api_key,
                                       max_retries=0)
            caught = []
            for c in (wrong, other):
                try:
                    await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                except openai.APIStatusError as exc:
                    caught.append([type(exc).__name__, exc.status_code, exc.body["code"]])
            models = await client.models.list()
            reply = await client.chat.completions.create(model=models.data[0].id, messages=[{"role": "user",
                                                         "content": "hi"}], max_tokens=5, stop=["zz"])
            pathlib.Path(row["out"]).write_text(json.dumps(caught))
            return 2.0
    """
    rollout, workers = rollout_for(make_config, agent_model, tmp_path, code)
    out_file = tmp_path / "caught.json"
    try:
        out = rollout.generate(rows_batch(workers.tokenizer, [{"out": str(out_file)}]),
                               SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    assert json.loads(out_file.read_text()) == [["AuthenticationError", 401, "invalid_api_key"],
                                                ["NotFoundError", 404, "episode_not_found"]]
    assert out["episode_error"][0] is None and float(out["turn_rewards"][0].sum()) == 2.0


def test_a_program_started_per_episode_with_openai_base_url(agent_model, make_config, tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(textwrap.dedent("""
        import json, os, sys, openai
        row = json.loads(sys.stdin.read())
        assert row == json.loads(os.environ["NANOVERL_ROW"])
        client = openai.OpenAI()                      # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["q"]}], max_tokens=4)
        print("some log line")
        print(json.dumps({"reward": row["r"], "info": {"steps": 1}}))
    """))
    config = make_config(agent_model, f"agent.command=[{sys.executable},{program}]", "rollout.max_new_tokens=48")
    workers = make_workers(config)
    rollout = AgentRollout(HFRollout(config, workers), AgentSource(command=(sys.executable, str(program))), config,
                           workers.tokenizer)
    try:
        out = rollout.generate(rows_batch(workers.tokenizer, [{"q": "a", "r": 0.25}, {"q": "b", "r": 1}]),
                               SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    assert out["turn_rewards"].sum(-1).tolist() == [0.25, 1.0]
    assert [info["steps"] for info in out["episode_info"]] == [1.0, 1.0]


def test_tool_calls_in_the_models_text_become_openai_tool_calls():
    tools = [{"type": "function", "function": {"name": "calculate", "parameters": {}}}]
    text = 'Let me see.<tool_call>{"name": "calculate", "arguments": {"expression": "2*3"}}</tool_call>'
    message, bad = assistant_message(text, tools, "call_1")
    assert bad == 0 and message["content"] == "Let me see."
    assert message["tool_calls"] == [{"id": "call_1_0", "type": "function", "function": {
        "name": "calculate", "arguments": '{"expression": "2*3"}'}}]
    for malformed in ['<tool_call>{"name": "calculate", "arguments": {</tool_call>', '<tool_call>{"name": "x", '
                      '"arguments": {}}</tool_call>', '<tool_call>{"name": "calculate"']:
        message, bad = assistant_message(malformed, tools, "c")
        assert bad == 1 and message == {"role": "assistant", "content": malformed}
    assert assistant_message("no call", tools, "c") == ({"role": "assistant", "content": "no call"}, 0)


KILL_IN_AGENT_STEP = '''
"""nanoverl-train that SIGKILLs itself in step 3's rollout, after its agents have run."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.agents.rollout import AgentRollout

to_batch = AgentRollout._to_batch
calls = []


def killing(self, batch, episodes):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return to_batch(self, batch, episodes)


AgentRollout._to_batch = killing
sys.exit(main(sys.argv[1:]))
'''


def test_an_agent_run_killed_mid_step_resumes_exactly(agent_model, tmp_path):
    """nanoverl-train with an agent file on the hf engine (half its episodes split into two rows): metrics and
    weights of a run SIGKILLed in step 3's rollout and resumed equal the uninterrupted run's."""
    from safetensors.torch import load_file

    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "target": str(2 * i)}) + "\n"
                                                  for i in range(10, 40)))
    (tmp_path / "agent.py").write_text(textwrap.dedent("""
        def agent(row, client):
            messages = [{"role": "user", "content": row["prompt"]}]
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "?"}]
            if int(row["target"]) % 4 == 0:      # half the agents restart from a rewritten history: a split
                messages = [{"role": "user", "content": row["prompt"] + " again"}]
            client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    """))
    args = [f"data.train_files=[{tmp_path / 'train.jsonl'}]", f"model.path={agent_model}", "worker.name=hf",
            "rollout.name=hf", "trainer.device=cpu", "data.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=24",
            f"agent.file={tmp_path / 'agent.py'}", "agent.function=agent", "trainer.total_steps=4",
            "trainer.save_every=1", "trainer.val_every=0", "trainer.progress=none", "tracking.trackers=[jsonl]",
            "reward.name=exact_match", "algorithm.advantage_estimator=gae", "critic.enable=true"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def train(*extra, driver=None):
        command = [sys.executable, str(driver)] if driver else [sys.executable, "-m", "nanoverl_core.cli"]
        return subprocess.run([*command, *args, *extra], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)

    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    done = train(f"trainer.output_dir={reference}")
    assert done.returncode == 0, done.stderr[-3000:]
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_IN_AGENT_STEP)
    killed = train(f"trainer.output_dir={run_dir}", driver=driver)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = train(f"trainer.output_dir={run_dir}")
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr[-3000:]

    def rows(folder):
        skip = ("timing/", "throughput/", "perf/")
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(skip)}
                for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows(run_dir) == rows(reference)
    assert rows(reference)[-1]["episode/calls/mean"] == 2.0
    assert any(row["episode/splits/mean"] > 0 for row in rows(reference))
    a, b = (load_file(str(d / "checkpoints" / "step_000004" / "actor" / "model.safetensors")) for d in (reference, run_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)


# A template that writes an assistant turn one way when it is the last message and another way once messages
# follow it: the turn the model sampled cannot stay as it was in a rendering of the longer conversation.
NOT_APPEND_ONLY = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[{{ m['content'] }}]"
                   "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>\n{% endif %}{% endfor %}"
                   "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_template_that_rewrites_a_turn_once_messages_follow_it_splits_the_episode(make_config, tmp_path):
    """The second call's history extends the first, but under this template it cannot be appended to the
    sampled ids: the episode splits, the second call's row starting from its own rendering."""
    model = build_tiny_model(tmp_path / "model", alphabet=PRINTABLE, hidden=32, max_positions=1024,
                             chat_template=NOT_APPEND_ONLY)
    code = """
        def agent(row, client):
            messages = [{"role": "user", "content": "hi"}]
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
            client.chat.completions.create(model="m", messages=messages, max_tokens=4)
            return 1.0
    """
    rollout, workers = rollout_for(make_config, model, tmp_path, code, "agent.on_error=zero", record=True)
    try:
        out = rollout.generate(rows_batch(workers.tokenizer, [{}]), SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    assert len(out) == 2 and out["episode_row"].tolist() == [0, 0] and not out["episode_failed"].any()
    assert [info["splits"] for info in out["episode_info"]] == [1.0, 1.0]
    for row in range(2):                          # each row: its own prompt, then the ids sampled for it
        prompt = out["prompts"][row][out["prompt_mask"][row].bool()].tolist()
        n = int(out["response_mask"][row].sum())
        assert out["responses"][row, :n].tolist() == rollout.engine.sampled[tuple(prompt)][0]
        assert out["model_mask"][row, :n].tolist() == [1.0] * n and float(out["turn_rewards"][row].sum()) == 1.0
    assert "[" in workers.tokenizer.decode(out["prompts"][1])       # the rewritten first turn, rendered once


REWRITING = """
    def agent(row, client):
        # call 2 extends call 1 (one row); call 3 restarts from a summary (a second row); call 4 extends call 3
        ask = lambda messages: client.chat.completions.create(model="m", messages=messages, max_tokens=5)
        messages = [{"role": "user", "content": row["q"]}]
        for turn in range(4):
            if turn == 2 and row["summarise"]:
                messages = [{"role": "user", "content": row["q"] + " (summary)"}]
            reply = ask(messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "on"}]
        return 0.25
"""


def test_an_agent_that_rewrites_its_history_gets_one_row_per_run_of_merged_calls(agent_model, make_config, tmp_path):
    """An episode whose agent restarts from a summary at its third call: two rows (calls 1-2 merged, calls 3-4
    merged), each the sampled ids bit for bit, each with the agent's reward, next to an episode that merges
    throughout; the trainer repeats the input row for the extra row (rollout_rows) and validation keeps the last."""
    from nanoverl_core.rollout import rollout_rows

    rollout, workers = rollout_for(make_config, agent_model, tmp_path, REWRITING, "rollout.max_new_tokens=200",
                                   record=True)
    tok = workers.tokenizer
    batch = rows_batch(tok, [{"q": "a?", "summarise": True}, {"q": "b?", "summarise": False}])
    batch["uid"] = ["u0", "u1"]
    try:
        torch.manual_seed(0)
        out = rollout.generate(batch, SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    assert out["episode_row"].tolist() == [0, 0, 1] and out["num_turns"].tolist() == [2, 2, 4]
    assert [info.get("splits", 0.0) for info in out["episode_info"]] == [1.0, 1.0, 0.0]
    assert [float(r.sum()) for r in out["turn_rewards"]] == [0.25] * 3
    assert out["final_text"][0] == out["final_text"][1]        # [reward] scores the episode's last reply on both
    second = tok.encode(render_chat(tok, [{"role": "user", "content": "a? (summary)"}], [], "hermes"),
                        add_special_tokens=False)
    assert out["prompts"][1][out["prompt_mask"][1].bool()].tolist() == second
    for row in range(3):
        prompt = out["prompts"][row][out["prompt_mask"][row].bool()].tolist()
        n = int(out["response_mask"][row].sum())
        ids, model = out["responses"][row, :n].tolist(), out["model_mask"][row, :n].tolist()
        first = [i for i, m in zip(ids, model) if m][:len(rollout.engine.sampled[tuple(prompt)][0])]
        assert first == rollout.engine.sampled[tuple(prompt)][0]       # the row's first call's ids, as sampled
    trained = rollout_rows(batch, out, split_rows=True)
    assert trained["uid"] == ["u0", "u0", "u1"] and len(trained.split_inputs(1)) == 2
    assert [len(part) for part in trained.split_inputs(1)] == [2, 1]
    kept = rollout_rows(rows_batch(tok, [{}, {}]), out, split_rows=False)
    assert len(kept) == 2 and kept["num_turns"].tolist() == [2, 4]


def test_tool_choice_required_or_named_opens_the_reply_with_the_call(agent_model, make_config, tmp_path):
    """tool_choice "required" and a named function: the endpoint writes the call's opening (environment tokens,
    model_mask 0) and the model samples the rest; the reply's text starts with it; "auto" writes nothing."""
    code = """
        import json, pathlib
        TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]

        def agent(row, client):
            reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                   tools=TOOLS, max_tokens=3, tool_choice=row["choice"])
            message = reply.choices[0].message
            pathlib.Path(row["out"]).write_text(json.dumps([message.content, bool(message.tool_calls)]))
    """
    rollout, workers = rollout_for(make_config, agent_model, tmp_path, code, "agent.score_answer=false")
    tok = workers.tokenizer
    choices = ["required", {"type": "function", "function": {"name": "look"}}, "auto"]
    openings = ["<tool_call>", '<tool_call>{"name": "look", "arguments": ', ""]
    rows = [{"choice": c, "out": str(tmp_path / f"reply{i}.json")} for i, c in enumerate(choices)]
    try:
        out = rollout.generate(rows_batch(tok, rows), SamplingParams(max_new_tokens=48, temperature=1.0))
    finally:
        rollout.close()
    for i, opening in enumerate(openings):
        content, _ = json.loads(Path(rows[i]["out"]).read_text())
        forced = tok.encode(opening, add_special_tokens=False)
        n = int(out["response_mask"][i].sum())
        assert out["responses"][i, :len(forced)].tolist() == forced
        assert out["model_mask"][i, :n].tolist() == [0.0] * len(forced) + [1.0] * (n - len(forced))
        assert (content or "").startswith(opening)                   # the model's own tokens follow the opening
