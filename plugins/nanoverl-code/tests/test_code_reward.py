"""The `code` reward: where the program and the test cases are read from (verl, HumanEval, MBPP layouts), the
verdicts and the score, its settings' errors through the CLI, and the reward called by name in the real pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanoverl_core import RLBatch, RewardError, load_config, load_registry
from nanoverl_core.reward import RewardScorer
from nanoverl_core.testing import assert_user_error, score_texts
from nanoverl_code import sandbox
from nanoverl_code.rewards import code, extract_code, score_row
from nanoverl_code.settings import CodeSettings

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "examples" / "configs"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
FRACTION = CodeSettings(score="fraction")

ADD_STDIO = {"reward_model": {"ground_truth": json.dumps({"inputs": ["1 2\n", "3 4\n", ["5", "6"]],
                                                          "outputs": ["3\n", "7", "11\n\n"]})}}
"""verl prime_code: a JSON string in reward_model.ground_truth; an input given as a list of lines."""
HUMANEVAL = {"prompt": 'def incr_list(l: list):\n    """Return list with elements incremented by 1."""\n',
             "test": "def check(candidate):\n    assert candidate([1, 2, 3]) == [2, 3, 4]\n"
                     "    assert candidate([]) == []\n",
             "entry_point": "incr_list"}
MBPP = {"test_list": ["assert first_repeated_char('abcabc') == 'a'", "assert first_repeated_char('abc') == None",
                      "assert math.isclose(half(3), 1.5)"],
        "test_imports": ["import math"]}


def block(program: str, before: str = "Here it is:") -> str:
    return f"{before}\n```python\n{program}\n```\nDone."


# ---- the program --------------------------------------------------------------------------------------------
def test_the_program_is_the_last_fenced_block_or_the_whole_response():
    response = "<think>```python\nprint(0)\n```</think>\n```py\nprint(1)\n```\ntext\n```python\nprint(2)\n```\n"
    assert extract_code(response, "last_block") == "print(2)\n"
    assert extract_code("<think>hm</think>print(3)", "last_block") == "print(3)"     # no block: all of it
    assert extract_code("x = 1\n```python\nprint(2)\n```", "response") == "x = 1\n```python\nprint(2)\n```"
    assert code("", "no code at all ", ADD_STDIO)["compile_error"] == 1.0
    out = code("", "   ", ADD_STDIO)
    assert out["score"] == 0.0 and out["no_code"] == 1.0


# ---- the layouts ----------------------------------------------------------------------------------------------
def test_stdin_stdout_rows_in_verls_prime_code_layout_are_scored_per_test_case():
    right = block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)")
    assert code("", right, ADD_STDIO) == {**dict.fromkeys(("no_code", "compile_error", "wrong_answer", "runtime_error",
                                                          "timeout", "memory", "output_limit", "sandbox_refusal"), 0.0),
                                         "score": 1.0, "pass_rate": 1.0}
    wrong = block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b if a < 5 else 0)")
    assert code("", wrong, ADD_STDIO)["score"] == 0.0                       # all-pass by default
    out = code("", wrong, ADD_STDIO, FRACTION)
    assert out["score"] == pytest.approx(2 / 3) and out["wrong_answer"] == pytest.approx(1 / 3)
    as_dict = {"reward_model": {"ground_truth": json.loads(ADD_STDIO["reward_model"]["ground_truth"])}}
    assert code("", right, as_dict)["score"] == 1.0                          # a dict works as the JSON string does


def test_the_stdout_comparison_modes():
    row = {"ground_truth": {"inputs": [""], "outputs": ["1 2\n3"]}}
    loose = block("print('1 2   ')\nprint('3')\nprint()")
    assert code("", loose, row)["score"] == 1.0
    assert code("", block("print('1\\n2 3')"), row, CodeSettings(compare="tokens"))["score"] == 1.0
    assert code("", block("print('1\\n2 3')"), row)["score"] == 0.0
    assert code("", loose, row, CodeSettings(compare="exact"))["score"] == 0.0


def test_call_based_rows_with_fn_name_compare_return_values_here():
    row = {"reward_model": {"ground_truth": json.dumps({"fn_name": "two_sum", "inputs": [[[2, 7, 11], 9], [[3, 3], 6]],
                                                        "outputs": [[[0, 1]], [0, 1]]})}}
    function = "def two_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n" \
               "        if target - x in seen:\n            return (seen[target - x], i)\n        seen[x] = i\n"
    assert code("", block(function), row)["score"] == 1.0                   # a tuple equals the JSON list
    method = "class Solution:\n    def two_sum(self, nums, target):\n        return [0, 1]\n"
    assert code("", block(method), row)["score"] == 1.0                     # LeetCode style
    raising = code("", block("def two_sum(nums, target):\n    raise ValueError('no')"), row, FRACTION)
    assert raising["runtime_error"] == 1.0


def test_humaneval_rows_complete_the_prompt_or_take_a_whole_function():
    completion = "    return [x + 1 for x in l]\n"
    assert code("", completion, HUMANEVAL, CodeSettings(code_from="response"))["score"] == 1.0
    assert code("", block("def incr_list(l):\n    return [x + 1 for x in l]"), HUMANEVAL)["score"] == 1.0
    out = code("", block("def incr_list(l):\n    return [x + 2 for x in l]"), HUMANEVAL)
    assert out["score"] == 0.0 and out["wrong_answer"] == 1.0
    nested = {"prompt": [{"role": "user", "content": "..."}], "extra_info": HUMANEVAL}   # verl: in extra_info
    assert code("", block("def incr_list(l):\n    return [x + 1 for x in l]"), nested)["score"] == 1.0


def test_mbpp_rows_run_each_assert_as_a_test_case_after_the_imports():
    program = block("def first_repeated_char(s):\n    seen = set()\n    for c in s:\n        if c in seen:\n"
                    "            return c\n        seen.add(c)\n\ndef half(x):\n    return x / 2")
    assert code("", program, MBPP)["score"] == 1.0
    out = code("", program.replace("x / 2", "x // 2"), MBPP, FRACTION)
    assert out["score"] == pytest.approx(2 / 3) and out["wrong_answer"] == pytest.approx(1 / 3)


def test_each_failure_kind_is_counted():
    row = {"test_list": ["assert f(1) == 1"] * 2}
    cases = {"compile_error": "def f(x) return x", "runtime_error": "def f(x):\n    return 1 / 0",
             "timeout": "def f(x):\n    while True:\n        pass", "wrong_answer": "def f(x):\n    return 2",
             "memory": "def f(x):\n    return [0] * 10**10", "output_limit": "def f(x):\n    print('y' * 2**21)"}
    settings = CodeSettings(cpu_s=1, wall_s=2, memory_mb=128)
    for kind, program in cases.items():
        out = code("", block(program), row, settings)
        assert out["score"] == 0.0 and out[kind] == 1.0, (kind, out)


def test_a_row_without_test_cases_or_with_a_broken_one_is_an_error_naming_the_fix():
    with pytest.raises(RewardError, match="no test cases"):
        code("", "print(1)", {"question": "?"})
    with pytest.raises(RewardError, match="not valid JSON"):
        code("", "print(1)", {"reward_model": {"ground_truth": "{inputs"}})
    with pytest.raises(RewardError, match="2 inputs and 1 outputs"):
        code("", "print(1)", {"ground_truth": {"inputs": ["", ""], "outputs": [""]}})
    with pytest.raises(RewardError, match="ground_truth_key"):
        code("", "print(1)", {"ground_truth": "x"}, CodeSettings(ground_truth_key="extra_info.tests"))


def test_max_tests_runs_the_first_test_cases_only():
    row = {"ground_truth": {"inputs": ["1", "2", "3"], "outputs": ["1", "2", "0"]}}
    out, kinds, _ = score_row(block("print(input())"), row, CodeSettings(max_tests=2))
    assert out["score"] == 1.0 and kinds == ["pass", "pass"]


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no system python3")
def test_rlimits_mode_scores_the_same_programs():
    """As root the programs run as a fresh uid, which cannot read an interpreter in root's home: the system one."""
    settings = CodeSettings(sandbox="rlimits", score="fraction", python="/usr/bin/python3")
    wrong = block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b if a < 5 else 0)")
    assert code("", wrong, ADD_STDIO, settings)["score"] == pytest.approx(2 / 3)
    assert code("", block("def incr_list(l):\n    return [x + 1 for x in l]"), HUMANEVAL, settings)["score"] == 1.0


def test_where_the_namespace_sandbox_cannot_be_made_the_setting_says_so(monkeypatch):
    monkeypatch.setattr("nanoverl_code.settings.probe", lambda isolation, *_: "unshare: Operation not permitted"
                        if isolation == "namespaces" else "")
    with pytest.raises(ValueError, match='sandbox = "rlimits"'):
        CodeSettings()
    assert CodeSettings(sandbox="rlimits").sandbox == "rlimits"


# ---- the registry, the pool, the CLI -------------------------------------------------------------------------------
def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300)


def test_the_reward_comes_from_the_installed_distribution_with_its_settings():
    registry = load_registry()
    assert registry.entry("reward", "code").provider == "nanoverl-code"
    assert registry.settings_class("reward", "code") is CodeSettings
    assert registry.get("reward", "code") is code


def test_the_reward_scores_by_name_in_the_real_worker_pool_and_the_workers_survive():
    registry = load_registry()
    cfg = load_config(CONFIGS / "debug_reinforce.toml", ["reward.name=code", "reward.workers=2", "reward.on_error=zero",
                                                          "reward.code.score=fraction", "reward.code.cpu_s=1",
                                                          "reward.code.wall_s=2"], registry=registry)
    assert cfg.reward.settings == CodeSettings(score="fraction", cpu_s=1, wall_s=2)
    scorer = RewardScorer(cfg.reward, registry)
    try:
        pool = scorer.pool()
        pool.start()
        workers = [w.proc.pid for w in pool.workers]
        killer = "import os, signal\n" + "".join(f"try:\n    os.kill({pid}, signal.SIGKILL)\nexcept OSError:\n    pass\n"
                                                 for pid in workers) + "os.kill(-1, signal.SIGKILL)\n"
        responses = [block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)"), block(killer),
                     block("while True:\n    pass"), block("print(")]
        rows = [ADD_STDIO] * 4
        batch = RLBatch({"x": torch.zeros(len(rows))}, {"row": rows, "prompt_text": ["q"] * len(rows),
                                                         "index": list(range(len(rows)))})
        scores, metrics = score_texts(scorer, batch, responses)
        assert [w.proc.pid for w in pool.workers] == workers and all(w.proc.poll() is None for w in pool.workers)
    finally:
        scorer.close()
    assert scores.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert metrics["reward/errors"] == 0.0 and metrics["reward/crashes"] == 0.0
    assert metrics["reward/pass_rate"] == pytest.approx(0.25)
    assert metrics["reward/timeout"] == pytest.approx(0.25) and metrics["reward/compile_error"] == pytest.approx(0.25)
    assert metrics["reward/runtime_error"] == pytest.approx(0.25)


@pytest.mark.parametrize("override, needle", [
    ("reward.code.cpu_s=-1", "reward.code.cpu_s"),
    ("reward.code.memory_mb=-5", "reward.code.memory_mb"),
    ("reward.code.wall_s=0", "reward.code.wall_s"),
    ("reward.code.sandbox=docker", "reward.code.sandbox"),
    ("reward.code.scores=all", "reward.code.score"),
    ("reward.code.limits_per=everything", "reward.code.limits_per"),
    ("reward.code.cgroup=/sys/fs/cgroup/no-such-cgroup", "reward.code.limits_per"),   # a limit it cannot enforce
    ("reward.code.processes=0", "reward.code.processes"),
    ("reward.code.disk_mb=-1", "reward.code.disk_mb"),
])
def test_a_bad_setting_exits_2_with_one_error_line_before_anything_starts(override, needle):
    proc = run_cli("--config", str(CONFIGS / "debug_reinforce.toml"), "--dry-run", "reward.name=code", override)
    assert_user_error(proc, needle)


def test_the_dry_run_resolves_the_reward_and_its_settings():
    proc = run_cli("--config", str(CONFIGS / "debug_reinforce.toml"), "--dry-run", "reward.name=code",
                   "reward.code.score=fraction")
    assert proc.returncode == 0, proc.stderr[-2000:]
    resolved = json.loads(proc.stdout)
    assert resolved["config"]["reward"]["code"]["score"] == "fraction"
    assert {"kind": "reward", "name": "code", "provider": "nanoverl-code"} in resolved["plugins"]
