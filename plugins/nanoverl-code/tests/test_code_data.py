"""The code data: HumanEval's shipped rows (every canonical solution passes through the code reward, a wrong one
fails), and the generated source code_tasks (rows per (seed, epoch), validation apart, each kind's reference
passes its own tests, bad settings through the CLI, a short run on the hf worker that kill-resumes exactly)."""

from __future__ import annotations

import json
import os
import random
import signal
import string
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nanoverl_core.testing import assert_user_error, without_machine_metrics
from nanoverl_code.humaneval import INSTRUCTION, row
from nanoverl_code.rewards import score_row, with_prompt
from nanoverl_code.settings import CodeSettings, CodeTasksSettings
from nanoverl_code.source import CodeTasksSource
from nanoverl_code.tasks import KINDS, draw

REPO = Path(__file__).resolve().parents[3]
HUMANEVAL = REPO / "examples" / "data" / "humaneval" / "test.jsonl"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
SETTINGS = CodeSettings()


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def fenced(program: str) -> str:
    return f"Here is the function:\n```python\n{program}```\n"


def scores(pairs: list[tuple[str, dict]]) -> list[float]:
    """The code reward's score of each (response, row), two rows at a time."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pair: score_row(pair[0], pair[1], SETTINGS)[0]["score"], pairs))


# ---- HumanEval --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def humaneval() -> list[dict]:
    from nanoverl_core.data import read_rows
    return read_rows([str(HUMANEVAL)], "data.val_files")                  # as the files source reads them


def test_the_shipped_humaneval_rows_are_the_164_problems_each_as_its_row(humaneval):
    assert [r["extra_info"]["task_id"] for r in humaneval] == [f"HumanEval/{i}" for i in range(164)]
    for r in humaneval:
        assert {k: v for k, v in r.items() if not k.startswith("__")} == row(r["extra_info"])
        problem = r["extra_info"]
        assert r["prompt"][0]["content"] == f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"
        assert f"def {problem['entry_point']}(" in problem["prompt"]


def test_every_humaneval_canonical_solution_passes_through_the_code_reward(humaneval):
    """All 164 as a body after the signature; a sample as a whole function without the prompt's imports (the
    reward puts the prompt first); a wrong body fails."""
    bodies = [(fenced(r["extra_info"]["canonical_solution"]), r) for r in humaneval]
    assert scores(bodies) == [1.0] * 164
    whole = []
    for r in humaneval[::12]:
        problem = r["extra_info"]
        lines = [line for line in problem["prompt"].splitlines() if not line.startswith(("from ", "import "))]
        whole.append((fenced("\n".join(lines) + "\n" + problem["canonical_solution"]), r))
    wrong = [(fenced("    return None\n"), r) for r in humaneval[5::20]]
    assert scores(whole) == [1.0] * len(whole)
    assert scores(wrong) == [0.0] * len(wrong)


def test_a_whole_function_or_a_body_is_joined_to_the_code_prompt():
    prompt = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """The sum."""\n'
    whole = "def total(xs: List[int]) -> int:\n    return sum(xs)\n"
    assert with_prompt(whole, prompt, "total") == prompt.rstrip("\n") + "\n\n\n" + whole
    assert with_prompt("    return sum(xs)\n", prompt, "total") == prompt + "    return sum(xs)\n"
    assert with_prompt("return sum(xs)\n", prompt, "total") == prompt + "    return sum(xs)\n"   # flush left
    assert with_prompt("  def total(xs): ...\n", prompt, "total").startswith(prompt)             # not top level
    row_ = {"extra_info": {"prompt": prompt, "test": "def check(f):\n    assert f([1, 2]) == 3\n",
                           "entry_point": "total"}}
    for program in (whole, "    return sum(xs)\n", "return sum(xs)\n", "import math\n" + whole):
        assert score_row(fenced(program), row_, SETTINGS)[0]["score"] == 1.0, program


# ---- the generated source ---------------------------------------------------------------------------------------
def source(**settings) -> CodeTasksSource:
    return CodeTasksSource(CodeTasksSettings(**settings))


def test_generated_rows_are_deterministic_fresh_every_epoch_and_never_a_validation_task():
    settings = {"size": 200, "val_size": 60, "tests": 3}
    gen = source(**settings)
    val = gen.rows("val", 0)
    questions = [r["extra_info"]["question"] for r in val]
    assert len(val) == 60 and len(set(questions)) == 60                    # validation rows are all different tasks
    epochs = [gen.rows("train", epoch) for epoch in range(2)]
    assert [len(rows) for rows in epochs] == [200, 200]
    for rows in epochs:
        assert not {r["extra_info"]["question"] for r in rows} & set(questions)
        assert {r["data_source"] for r in rows} == {k for k, (level, _) in KINDS.items() if level == 1}
    assert epochs[0] != epochs[1]
    assert source(**settings).rows("train", 1) == epochs[1]              # the same arguments, the same rows
    assert source(**settings).rows("val", 0) == val
    assert source(**settings, seed=5).rows("train", 1) != epochs[1]
    assert source(**settings, val_seed=7).rows("val", 0) != val
    r = epochs[0][0]
    assert json.loads(json.dumps(r)) == r                                  # rewards get it in worker processes
    assert r["prompt"] == [{"role": "user", "content": r["extra_info"]["question"] + " " + CodeTasksSettings().instruction}]
    cases = json.loads(r["reward_model"]["ground_truth"])
    assert set(cases) == {"fn_name", "inputs", "outputs"} and len(cases["inputs"]) == len(cases["outputs"]) == 3


def test_difficulty_and_tasks_choose_the_kinds():
    for level in (2, 3):
        rows = source(difficulty=level, size=120, val_size=0).rows("train", 0)
        assert {r["extra_info"]["level"] for r in rows} == {level}
        assert {r["data_source"] for r in rows} == {k for k, (lv, _) in KINDS.items() if lv == level}
    rows = source(tasks=["affine", "caesar"], difficulty=2, size=40, val_size=0).rows("train", 0)
    assert {r["data_source"] for r in rows} == {"affine", "caesar"}


def test_each_kinds_reference_solution_passes_its_own_tests_and_a_constant_fails():
    """Every kind, three tasks each: its reference solution passes, and a function returning the first test
    case's expected value fails (the arguments are drawn so that the expected values differ)."""
    rng, pairs, expected = random.Random(0), [], []
    for kind in KINDS:
        for _ in range(3):
            task = draw(kind, rng, 3)
            sample = {"reward_model": {"ground_truth": json.dumps(
                {"fn_name": task.fn_name, "inputs": task.inputs, "outputs": [[o] for o in task.outputs]})}}
            constant = f"def {task.fn_name}(*args):\n    return {task.outputs[0]!r}\n"
            pairs += [(fenced(task.solution), sample), (fenced(constant), sample)]
            expected += [1.0, 0.0]
    assert scores(pairs) == expected


@pytest.mark.parametrize("override, needles", [
    ("data.code_tasks.difficulty=4", ["'data.code_tasks.difficulty': 4 is not an integer in [1, 3]"]),
    ("data.code_tasks.tasks=[affine, clmap]", ["'data.code_tasks.tasks'", "entry 1, 'clmap', is not a task kind",
                                               "did you mean 'clamp'?"]),
    ("data.code_tasks.tset=3", ["data.code_tasks.tset", "did you mean 'data.code_tasks.tests'"]),
])
def test_bad_settings_exit_2_with_one_line_before_anything_is_written(tmp_path, override, needles):
    run_dir = tmp_path / "run"
    assert_user_error(run_cli("--config", "examples/configs/debug_reinforce.toml", "data.source=code_tasks",
                              "data.train_files=[]", "data.val_files=[]", "reward.name=code", override,
                              f"trainer.output_dir={run_dir}", "--dry-run"), *needles)
    assert not run_dir.exists()


def test_too_many_validation_tasks_for_the_kinds_is_one_line_before_anything_is_written(tmp_path):
    assert_user_error(run_cli("--config", "examples/configs/debug_reinforce.toml", "data.source=code_tasks",
                              "data.train_files=[]", "data.val_files=[]", "reward.name=code",
                              "data.code_tasks.tasks=[long_words]", "data.code_tasks.val_size=100",
                              f"trainer.output_dir={tmp_path / 'run'}"),
                      "[data.code_tasks] the kinds long_words gave only 30 of 100 different validation tasks", "lower size / val_size")
    assert not (tmp_path / "run").exists()


# ---- a short run through the command line -------------------------------------------------------------------------
KILL_DRIVER = '''
"""nanoverl-train that SIGKILLs itself in the middle of step 5 (after the checkpoint of step 4)."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.trainer.trainer import Trainer

generate = Trainer.generate


def killing(self, batch, gen_round=0):
    if self.step == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return generate(self, batch, gen_round)


Trainer.generate = killing
sys.exit(main(sys.argv[1:]))
'''


def metrics_of(run_dir: Path) -> list[str]:
    return [json.dumps(without_machine_metrics(json.loads(line)))
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from nanoverl_hf.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", alphabet=string.printable, max_positions=512)


def test_a_run_on_generated_tasks_killed_mid_step_resumes_to_the_identical_run(tiny_model, tmp_path):
    """GRPO on the hf worker with a tiny random model, the code reward scoring every sample in the sandbox:
    12 rows an epoch in batches of 4 (the run crosses two epochs of fresh rows), SIGKILLed in step 5 and
    resumed from step 4's checkpoint: the same metrics, line for line, and every response scored."""
    args = ["--config", "examples/configs/tiny_grpo.toml", "data.source=code_tasks", "data.train_files=[]",
            "data.val_files=[]", "data.code_tasks.size=12", "data.code_tasks.val_size=4", "data.code_tasks.tests=2",
            "data.apply_chat_template=false", "data.max_prompt_length=400", "data.batch_size=4", "rollout.n=2",
            "rollout.max_new_tokens=8", f"model.path={tiny_model}", "reward.name=code", "reward.workers=2",
            "reward.overlong_buffer_len=0",
            "trainer.total_steps=6", "trainer.save_every=2", "trainer.val_every=3", "trainer.progress=none",
            "trainer.rollout_samples=-1", "tracking.trackers=[jsonl]"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    proc = run_cli(*args, f"trainer.output_dir={reference}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert {"val/reward/mean", "reward/compile_error"} <= set(metrics[2])
    scored = [json.loads(line) for step in range(1, 7)
              for line in (reference / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    assert len(scored) == 6 * 4 * 2 and all(s["score"] in (0.0, 1.0) for s in scored)
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    proc = subprocess.run([sys.executable, str(driver), *args, f"trainer.output_dir={run_dir}"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    resumed = run_cli(*args, f"trainer.output_dir={run_dir}")
    assert resumed.returncode == 0 and "(step 4)" in resumed.stderr, resumed.stderr[-3000:]
    assert metrics_of(run_dir) == metrics_of(reference)
