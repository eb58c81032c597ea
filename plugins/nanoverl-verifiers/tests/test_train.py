"""`nanoverl-train` as a user runs it, with `agent.name = "verifiers"` and `data.source = "verifiers"` on the
tiny hf model: the environment's own dataset rows are trained on, its rubric scored what the rollouts dumped
(train and validation), its tool environment runs its loop. Each mistake in [agent.verifiers] is one `error:`
line and exit status 2, before the run directory is written or a model loads."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("fastapi")

from conftest import TOOL_ENV, error_line, read_jsonl, records, run_cli  # noqa: E402


def train(model, run_dir, *overrides: str):
    return run_cli(f"model.path={model}", "worker.name=hf", "rollout.name=hf", "trainer.device=cpu",
                   "data.source=verifiers", "agent.name=verifiers", "agent.score_answer=false", "agent.workers=2",
                   "data.batch_size=2", "rollout.n=2", "rollout.max_new_tokens=24",
                   "algorithm.advantage_estimator=reinforce_plus_plus", "trainer.total_steps=2", "trainer.save_every=0",
                   "trainer.progress=none", "trainer.rollout_samples=-1", "tracking.trackers=[jsonl]",
                   f"trainer.output_dir={run_dir}", *overrides)


def test_training_on_the_environments_dataset_scored_by_its_rubric(chat_model, tmp_path):
    """Two steps on vf-arith's dataset and a validation pass on its eval_dataset: every dumped training
    rollout's model text is a completion the rubric scored, its score is the rubric's reward on that text, the
    rubric's metrics are logged as episode/vf_*, and the validation rows are the eval_dataset's."""
    seen_dir, run_dir = tmp_path / "seen", tmp_path / "run"
    seen_dir.mkdir()
    proc = train(chat_model, run_dir, "agent.verifiers.env_id=vf-arith",
                 f"agent.verifiers.env_args.record_dir={seen_dir}", "trainer.val_every=2",
                 "data.verifiers.val_examples=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = records(seen_dir)
    trained = [r for r in seen if r["info"]["a"] < 100]
    validated = [r for r in seen if r["info"]["a"] >= 100]
    dumped = [row for step in (1, 2) for row in read_jsonl(run_dir / "rollouts" / f"step_{step}.jsonl")]
    assert len(dumped) == len(trained) == 2 * 2 * 2                           # steps x prompts x samples
    texts = [[t["text"] for t in row["episode"] if t["role"] == "model"] for row in dumped]
    assert all(len(t) == 1 for t in texts)
    assert Counter(t[0] or None for t in texts) == Counter(r["completion"] for r in trained)
    by_text = {r["completion"] or "": r for r in trained}
    for row, (text,) in zip(dumped, texts):
        answer = by_text[text]["answer"]
        assert row["score"] == pytest.approx(float(answer in text) + 0.005 * len(text), abs=1e-6)
        assert "Add the two numbers." in row["prompt"] and f"{int(answer) // 2}+" in row["prompt"]
    assert sorted(r["info"]["a"] for r in validated) == [100, 101]             # the eval_dataset, once
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    train_rows = [m for m in metrics if "episode/vf_chars/mean" in m]
    assert len(train_rows) == 2 and all(m["episode/vf_num_turns/mean"] <= 1.0 and m["episode/errors"] == 0
                                        for m in train_rows)


def test_a_tool_environment_runs_its_loop_with_the_model(chat_model, tmp_path):
    """The ToolEnv of fixture_envs/tool_env.py with the random model: the model answers in text (it writes no
    `<tool_call>`), verifiers ends each episode on no_tools_called after one call and scores it, no episode
    fails. The tool-call path itself (a call parsed, the tool run, its result merged) is test_agent.py's
    scripted test."""
    seen_dir, run_dir = tmp_path / "seen", tmp_path / "run"
    seen_dir.mkdir()
    proc = train(chat_model, run_dir, f"agent.verifiers.env_id={TOOL_ENV}",
                 f"agent.verifiers.env_args.record_dir={seen_dir}", "trainer.total_steps=1", "trainer.val_every=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (metrics,) = [m for m in read_jsonl(run_dir / "metrics.jsonl") if "episode/vf_num_turns/mean" in m]
    assert metrics["episode/errors"] == 0 and metrics["episode/calls/mean"] == 1.0
    assert metrics["episode/vf_total_tool_calls/mean"] == 0.0 and not (seen_dir / "tool_calls.jsonl").exists()
    dumped = read_jsonl(run_dir / "rollouts" / "step_1.jsonl")
    assert len(dumped) == 4 and all([t["role"] for t in row["episode"]] == ["model"] for row in dumped)
    assert metrics["episode/vf_num_turns/mean"] == 1.0 and metrics["episode/vf_add_calls/mean"] == 0.0


@pytest.mark.parametrize(("overrides", "message"), [
    (["agent.verifiers.env_id=vf-arithm"],
     "error: config key 'agent.verifiers.env_id': no verifiers environment 'vf-arithm': no module 'vf_arithm' is "
     "installed; did you mean 'vf-arith'?"),
    (["agent.verifiers.env_id=vf-arith", "agent.verifiers.env_args.num_exampels=3"],
     "error: config key 'agent.verifiers.env_args': vf_arith.load_environment takes no argument 'num_exampels'; "
     "did you mean 'num_examples'? (it takes: num_examples, num_eval, record_dir)"),
    (["agent.verifiers.env_id=vf-arith", "agent.verifiers.env_args.num_examples=0"],
     "error: [agent.verifiers] env_id = 'vf-arith': the environment does not build here (RuntimeError: Failed to "
     "load environment 'vf-arith': num_examples must be at least 1, got 0)"),
    ([f"agent.verifiers.env_id={TOOL_ENV.replace(':load_', ':lod_')}"],
     "has no function 'lod_tool_environment' (did you mean 'load_tool_environment'?)"),
    (["agent.name=", "agent.file=x.py"],
     'error: data.source = "verifiers" reads the rows of the [agent.verifiers] environment; set agent.name'),
])
def test_each_mistake_is_one_error_line_before_anything_loads(chat_model, tmp_path, overrides, message):
    run_dir = tmp_path / "run"
    if "agent.file=x.py" in overrides:
        (tmp_path / "x.py").write_text("def agent(row, client):\n    return 1.0\n")
        overrides = ["agent.name=", f"agent.file={tmp_path / 'x.py'}", "agent.function=agent"]
    line = error_line(train(chat_model, run_dir, *overrides))
    assert message in line and "\n" not in line
    assert not run_dir.exists()
