"""Agents in the core: every [agent] mistake is one `error:` line before anything loads, and a whole run on the
debug backends with an agent that calls `/v1/completions` through the real `openai` client trains on the
sampled ids (the chat path, faults and exact resume with a real tokenizer: plugins/nanoverl-hf/tests/test_agents.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import EXAMPLES, assert_user_error, cli_env, read_metrics, run_cli

pytest.importorskip("fastapi")
pytest.importorskip("openai")

DEBUG = str(EXAMPLES / "debug_ppo.toml")
AGENT = '''
import json, os

def agent(row, client):
    first = client.completions.create(model="m", prompt=row["prompt"], max_tokens=2,
                                      extra_body={"return_token_ids": True})
    prompt_ids, ids = first.choices[0].prompt_token_ids, first.choices[0].token_ids
    # token ids in, token ids out: the sampled ids, then the prompt's last token ("=") again
    second = client.completions.create(model="m", prompt=prompt_ids + ids + prompt_ids[-1:], max_tokens=2,
                                       logprobs=1, extra_body={"return_token_ids": True})
    with open(os.environ["NANOVERL_TEST_OUT"], "a") as out:
        out.write(json.dumps([prompt_ids, ids, second.choices[0].token_ids,
                              second.choices[0].logprobs.token_logprobs]) + "\\n")
    return float(second.choices[0].text.startswith(row["target"][:1]))
'''


def test_an_agent_on_the_debug_backends_trains_through_completions_calls(tmp_path):
    """Two /v1/completions calls, the second's prompt extending the first's prompt and completion, merge into
    one row per episode; the agent's reward is the score ([reward] off); the debug rollout's log-probs come
    back when asked; the run writes the episode metrics."""
    path, out = tmp_path / "agent.py", tmp_path / "seen.jsonl"
    path.write_text(AGENT)
    proc = run_cli("--config", DEBUG, f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=2",
                   "trainer.val_every=0", "trainer.save_every=0", "trainer.progress=none", "tracking.trackers=[jsonl]",
                   "data.batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8", "rollout.debug.log_probs=true",
                   f"agent.file={path}", "agent.function=agent", "agent.score_answer=false",
                   env=cli_env(NANOVERL_TEST_OUT=str(out)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(seen) == 2 * 4 * 2                              # steps x prompts x samples
    assert all(len(lps) == len(second) and all(lp <= 0 for lp in lps) for _, _, second, lps in seen)
    metrics = read_metrics(tmp_path / "run")
    assert all(m["episode/calls/mean"] == 2.0 and m["episode/turns/mean"] == 2.0 for m in metrics)
    assert all(m["episode/errors"] == 0.0 for m in metrics)
    assert all(m["episode/env_tokens/mean"] == 1.0 for m in metrics)   # the "=" between the two completions


SPLITTING = '''
def agent(row, client):
    client.completions.create(model="m", prompt=row["prompt"], max_tokens=2)
    # a prompt that does not extend the first call's: the episode's second row
    second = client.completions.create(model="m", prompt="?" + row["prompt"], max_tokens=2)
    return 1.0 if second.choices[0].text else 0.0
'''


def test_episodes_that_split_train_one_row_each_part_with_mini_batches_and_validation(tmp_path):
    """Every episode splits at its second call: two rows per episode in training (PPO with a critic and two
    mini-batches a step, the input row repeated for each: rollout_rows), one answer per episode in validation."""
    path = tmp_path / "agent.py"
    path.write_text(SPLITTING)
    proc = run_cli("--config", DEBUG, f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=2",
                   "trainer.val_every=2", "data.val_max_samples=8", "trainer.save_every=0", "trainer.progress=none",
                   "tracking.trackers=[jsonl]", "data.batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8",
                   "actor.mini_batch_size=2", "critic.mini_batch_size=2", f"agent.file={path}",
                   "agent.function=agent", "agent.score_answer=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = read_metrics(tmp_path / "run")
    assert all(m["episode/splits/mean"] == 1.0 and m["episode/errors"] == 0.0 for m in metrics)
    assert all(m["episode/turns/mean"] == 1.0 for m in metrics)          # one model turn in each row
    assert "val/reward/mean" in metrics[-1]


@pytest.mark.parametrize("overrides,needles", [
    (["agent.file=missing.py", "agent.function=f"], ["agent.file", "missing.py"]),
    (["agent.file={agent}", "agent.function=nope"], ["agent.function", "'nope'", "its functions: agent"]),
    (["agent.file={agent}"], ["agent.file needs agent.function"]),
    (["agent.function=agent"], ["agent.function is set but agent.file is empty"]),
    (["agent.command=[no-such-program-here]"], ["agent.command", "no-such-program-here", "not found"]),
    (["agent.name=nope"], ["agent.name = 'nope'", "no agent of that name"]),
    (["agent.name=x", "agent.command=[python]"], ["agent.name and agent.command are both set"]),
    (["agent.file={agent}", "agent.function=agent", "environment.name=calculator"],
     ["[agent] and [environment] are both set"]),
    (["agent.command=[python]", "agent.tool_format=json"], ["agent.tool_format"]),
], ids=["missing-file", "missing-function", "file-without-function", "function-without-file", "no-program",
        "unknown-name", "two-sources", "with-environment", "bad-tool-format"])
def test_every_agent_mistake_is_one_error_line_before_anything_loads(tmp_path, overrides, needles):
    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    proc = run_cli("--config", DEBUG, "--dry-run", *[o.format(agent=path) for o in overrides])
    assert_user_error(proc, *needles)


def test_without_the_endpoints_packages_the_line_says_what_to_install(monkeypatch, tmp_path):
    from nanoverl_core import load_config, load_registry
    from nanoverl_core.errors import ConfigError
    from nanoverl_core.trainer.resolve import load_agent

    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    registry = load_registry()
    config = load_config(DEBUG, [f"agent.file={path}", "agent.function=agent"], registry=registry)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r'\[agent\] needs fastapi: pip install "nanoverl\[agents\]"'):
        load_agent(config, registry)
