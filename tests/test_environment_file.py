"""An environment or tools from one file (environment.file), as easy as reward.file: the file's factory,
or its plain functions as tools, run in the environment worker processes like a registered environment,
with the same errors; and text an environment renders that the tokenizer cannot encode is the
environment's error, not a data row's.
"""

from __future__ import annotations

import os

from conftest import EXAMPLES, assert_user_error, cli_env, read_metrics, run_cli

COPY_TURNS = str(EXAMPLES / "debug_copy_turns.toml")

ECHO_ENV = '''
import os

from nanoverl_core.env import EnvStep, Turn


class Echo:
    """Answers each turn with "=" and rewards it 1 if it is the row's target's first character."""

    def __init__(self, first):
        self.first = first
        with open(os.environ["NANOVERL_TEST_PIDS"], "a") as log:  # which process builds the episodes
            log.write(f"{os.getpid()} {os.getppid()}\\n")

    def step(self, turn: Turn) -> EnvStep:
        return EnvStep(observation="=", reward=float(turn.text.strip()[:1] == self.first), done=turn.index == 1,
                       info={"first_right": float(turn.text.strip()[:1] == self.first)})


def make_env(sample):
    return Echo(str(sample["target"])[:1])
'''

TOOLS = '''
def lookup(code: str) -> str:
    """A number for a code.

    Args:
        code: a few digits
    """
    return code[::-1]
'''

BASE = ["environment.name=", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=0",
        "trainer.progress=none", "tracking.trackers=[jsonl]"]


def test_an_environment_from_a_file_plays_episodes_in_its_worker_processes(tmp_path):
    """environment.file + environment.function: no package, no entry point; the factory runs in the
    environment workers (another process than the trainer), its counters are logged like a registered one's."""
    env_file = tmp_path / "echo_env.py"
    env_file.write_text(ECHO_ENV)
    run_dir = tmp_path / "run"
    pids = tmp_path / "pids.log"
    proc = run_cli("--config", COPY_TURNS, *BASE, f"environment.file={env_file}", "environment.function=make_env",
                   f"trainer.output_dir={run_dir}", env=cli_env(NANOVERL_TEST_PIDS=str(pids)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"environment.file runs the Python code in {env_file}" in proc.stderr
    metrics = read_metrics(run_dir)
    assert len(metrics) == 2 and metrics[-1]["episode/turns/mean"] > 1 and "val/episode/turns/mean" in metrics[-1]
    assert "episode/first_right/mean" in metrics[-1]
    built_in = {tuple(line.split()) for line in pids.read_text().splitlines()}
    assert len({pid for pid, _ in built_in}) == 2                     # environment.workers = 2 processes
    assert len({parent for _, parent in built_in}) == 1 and str(os.getpid()) not in {p for pair in built_in for p in pair}


def test_an_environment_file_mistake_is_one_line_naming_the_key(tmp_path):
    env_file = tmp_path / "echo_env.py"
    env_file.write_text(ECHO_ENV)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    cases = [
        ([f"environment.file={env_file}", "environment.function=make_enn"],
         ["environment.function: 'make_enn' is not a function in", "its functions: make_env"]),
        ([f"environment.file={env_file}"], ["needs one of environment.function", "environment.tools"]),
        ([f"environment.file={broken}", "environment.function=make_env"], ["failed to import (RuntimeError: boom)"]),
        (["environment.name=copy_turns", f"environment.file={env_file}", "environment.function=make_env"],
         ["environment.name = 'copy_turns' is set next to environment.file"]),
        (["environment.function=make_env"], ["environment.function is set but environment.file is empty"]),
    ]
    for overrides, needles in cases:
        proc = run_cli("--config", COPY_TURNS, *BASE, *overrides, f"trainer.output_dir={tmp_path / 'run'}",
                       "--dry-run")
        assert_user_error(proc, *needles)


def test_tools_from_a_file_whose_instructions_the_tokenizer_cannot_spell_name_the_environment(tmp_path):
    """The debug tokenizer spells digits and "=": the tool instructions rendered into every prompt are the
    environment's text, so the error names the environment (and says the rows are fine), not a data row."""
    tools = tmp_path / "my_tools.py"
    tools.write_text(TOOLS)
    proc = run_cli("--config", COPY_TURNS, *BASE, f"environment.file={tools}", "environment.tools=[lookup]",
                   f"trainer.output_dir={tmp_path / 'run'}")
    line = assert_user_error(proc, f"environment '{tools}:lookup'", "tool instructions",
                             "the data rows are not at fault")
    assert "row" not in line.split("the data rows")[0], line


def test_a_registered_tool_environments_unspellable_instructions_name_it_not_a_row(tmp_path):
    """The same for a registered tool environment (the built-in calculator on the debug tokenizer): before,
    the error blamed `val.jsonl row 0 ... fix the row`."""
    proc = run_cli("--config", COPY_TURNS, *BASE[1:], "environment.name=calculator",
                   f"trainer.output_dir={tmp_path / 'run'}")
    line = assert_user_error(proc, "environment 'calculator'", "tool instructions")
    assert "row 0" not in line and "fix the row" not in line, line


def test_file_tools_become_a_tool_environment_in_the_worker(tmp_path):
    """environment.tools: plain functions of the file, called through the `<tool_call>` format by the
    environment worker that loaded the file (EnvironmentSource is what the pool sends it)."""
    from nanoverl_core.env import EnvironmentPool, EnvironmentSource, Turn

    tools = tmp_path / "my_tools.py"
    tools.write_text(TOOLS)
    source = EnvironmentSource(file=str(tools), tools=("lookup",))
    assert [t.__name__ for t in source.load().tools] == ["lookup"] and source.label == f"{tools}:lookup"
    pool = EnvironmentPool(source, None, 1, 30.0)
    try:
        call = '<tool_call>{"name": "lookup", "arguments": {"code": "123"}}</tool_call>'
        assert pool.run([(0, "start", {"prompt": "x"})]) == {0: ("ok", None)}
        kind, step = pool.run([(0, "step", Turn(call, (), 0))])[0]
        assert kind == "ok" and step.observation == [{"role": "tool", "content": "321"}]
        assert step.info == {"tool_calls": 1.0, "tool_errors": 0.0}
    finally:
        pool.close()
