"""The `math_verify` reward: hand-written answers with the numbers they must score, its settings, the
timeout it may take from math-verify (main thread only, never over another alarm), and the reward
through the real entry point, in the real reward pool and the real CLI (`nanoverl-train`).

The package is pip-installed (`nox -s math`, or `pip install -e plugins/nanoverl-math`); the entry-point
tests check that the registry found it as the distribution `nanoverl-math`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from nanoverl_core import RLBatch, RewardError, load_config, load_registry
from nanoverl_core.reward import RewardScorer
from nanoverl_core.testing import score_texts
from nanoverl_math.rewards import math_verify, signal_timeout
from nanoverl_math.settings import MathVerifySettings

REPO = Path(__file__).resolve().parents[3]
CONFIGS = REPO / "examples" / "configs"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONUNBUFFERED": "1"}


def row(gold: str) -> dict:
    return {"reward_model": {"ground_truth": gold}}


# ---- what it scores -------------------------------------------------------------------------------------
@pytest.mark.parametrize("gold, response, score", [
    ("72", "She sold 48 + 24 = 72 clips.\n#### 72", 1.0),
    ("72", "#### 73", 0.0),
    ("72", "The answer is \\boxed{72}.", 1.0),
    ("72", "so \\boxed{72} and then 5 more", 1.0),            # the boxed answer counts, not the last number
    ("3", "\\boxed{3} apples and 2 pears, 5 fruits", 1.0),
    ("72", "#### 72\nThe 5 friends", 0.0),                     # no "####" anchor in math-verify: 5 is the answer
    ("5", "First 3, then 4, finally 5", 1.0),                  # several numbers: the last one
    ("1600", "He pays 1600 dollars, 2 times", 0.0),
    ("0.5", "The answer is $\\frac{1}{2}$", 1.0),              # fractions and decimals are one value
    ("\\frac{1}{2}", "0.5", 1.0),
    ("\\frac{1}{2}", "1/2", 1.0),
    ("0.5", "\\boxed{\\frac{1}{2}}", 1.0),
    ("1000", "#### 1,000", 1.0),                               # thousands separators
    ("1234567", "#### 1,234,567", 1.0),
    ("1600", "#### $1,600.00", 1.0),                           # units and dollar signs are stripped
    ("1000", "1000 dollars", 1.0),
    ("18", "The answer is 18 meters.", 1.0),
    ("18", "\\boxed{\\$18}", 1.0),
    ("18", "He earns \\$18 per hour", 0.0),                    # an escaped \$ in prose: math-verify finds nothing
    ("-7", "The temperature is -7 degrees", 1.0),              # negative numbers
    ("7", "#### -7", 0.0),
    ("5", "10-5", 1.0),                                        # an expression is evaluated
    ("34", "3,4", 0.0),                                        # a decimal comma: 3.4
    ("0.5", "50%", 1.0),                                       # a percentage is its fraction ...
    ("50", "50%", 1.0),                                        # ... and its number (math-verify's leniency)
    ("72", "The answer is 72.0", 1.0),
    ("72", "I do not know.", 0.0),                             # no answer at all
    ("72", "", 0.0),
])
def test_hand_written_answers_score_as_pinned(gold, response, score):
    assert math_verify("", response, row(gold))["score"] == score


@pytest.mark.parametrize("response, found", [("#### 73", 1.0), ("I do not know.", 0.0), ("", 0.0),
                                             ("He earns \\$18 per hour", 0.0), ("3,4", 1.0)])
def test_answer_found_tells_a_wrong_answer_from_none(response, found):
    assert math_verify("", response, row("72"))["answer_found"] == found


def test_the_scores_for_correct_wrong_and_no_answer_are_settings():
    settings = MathVerifySettings(correct=2.0, wrong=-1.0, no_answer=-0.5)
    assert [math_verify("", r, row("72"), settings)["score"] for r in ("#### 72", "#### 7", "no idea")] == [2.0, -1.0, -0.5]


def test_the_gold_answer_is_read_from_the_usual_fields_or_the_named_one():
    for sample in [{"ground_truth": "7"}, {"target": "7"}, {"answer": "3 + 4 = 7\n#### 7"}, row("7")]:
        assert math_verify("", "so \\boxed{7}", sample)["score"] == 1.0, sample
    nested = {"extra_info": {"final": "7"}, "ground_truth": "8"}
    assert math_verify("", "\\boxed{7}", nested, MathVerifySettings(ground_truth_key="extra_info.final"))["score"] == 1.0
    with pytest.raises(RewardError, match="no field 'extra_info.gold'"):
        math_verify("", "7", nested, MathVerifySettings(ground_truth_key="extra_info.gold"))
    with pytest.raises(RewardError, match="reward_model.ground_truth"):
        math_verify("", "7", {"question": "3 + 4?"})


def test_gold_format_latex_reads_latex_and_expr_reads_plain_expressions():
    expr = MathVerifySettings(gold_format="expr")
    assert math_verify("", "\\boxed{0.5}", row("1/2"), expr)["score"] == 1.0
    assert math_verify("", "\\boxed{0.5}", row("$\\frac{1}{2}$"))["score"] == 1.0   # a $ is kept as written
    with pytest.raises(RewardError, match='gives no answer when parsed as expr; set .* gold_format = "latex"'):
        math_verify("", "0.5", row("\\frac{1}{2}"), expr)
    with pytest.raises(RewardError, match="gives no answer when parsed as latex"):
        math_verify("", "0.5", row("   "))


# ---- math-verify's SIGALRM timeout: only where it can work ------------------------------------------------
def test_the_signal_timeout_is_used_only_in_the_main_thread_without_another_alarm():
    assert signal_timeout(5) == 5 and signal_timeout(0) is None
    seen = []
    thread = threading.Thread(target=lambda: seen.append(signal_timeout(5)))
    thread.start()
    thread.join()
    assert seen == [None]
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 60)                 # the trainer's reward.timeout_s alarm
        assert signal_timeout(5) is None
        assert math_verify("", "\\boxed{72}", row("72"))["score"] == 1.0
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 50       # math-verify's alarm(0) did not cancel it
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_reward_scores_in_a_thread_where_math_verify_signals_would_raise():
    out = []
    thread = threading.Thread(target=lambda: out.append(math_verify("", "\\boxed{\\frac{1}{2}}", row("0.5"))))
    thread.start()
    thread.join()
    assert out == [{"score": 1.0, "answer_found": 1.0}]


SLOW = "\\boxed{(x+1)^{10000}}"
"""An answer whose comparison with "3" runs for minutes in sympy (measured: over 60 s) without a timeout."""


def test_math_verify_own_timeout_bounds_a_slow_comparison_in_the_main_thread():
    start = time.monotonic()
    assert math_verify("", SLOW, row("3"), MathVerifySettings(timeout_s=1)) == {"score": 0.0, "answer_found": 1.0}
    assert time.monotonic() - start < 10


def score_batch(responses: list[str], golds: list[str], *overrides: str) -> tuple[list[float], dict, float]:
    """(scores, metrics, seconds) of the configured math_verify over the responses, as the trainer scores them."""
    registry = load_registry()
    cfg = load_config(CONFIGS / "debug_reinforce.toml", ["reward.name=math_verify", "reward.on_error=zero", *overrides],
                      registry=registry)
    batch = RLBatch({"x": torch.zeros(len(golds))}, {"row": [row(g) for g in golds], "prompt_text": ["q"] * len(golds),
                                                     "index": list(range(len(golds)))})
    scorer = RewardScorer(cfg.reward, registry)
    start = time.monotonic()
    try:
        scores, metrics = score_texts(scorer, batch, responses)
    finally:
        scorer.close()
    return scores.tolist(), metrics, time.monotonic() - start


def test_in_a_worker_process_math_verify_own_timeout_holds():
    scores, metrics, seconds = score_batch([SLOW, "\\boxed{3}"], ["3", "3"], "reward.workers=1",
                                           "reward.math_verify.timeout_s=1")
    assert scores == [0.0, 1.0] and metrics["reward/errors"] == 0.0 and seconds < 60


def test_in_the_trainer_under_reward_timeout_s_the_alarm_is_nanoverls_not_math_verifys():
    """reward.workers = 0 with reward.timeout_s = 2: nanoverl's SIGALRM is armed around the call, so math_verify
    passes None to math-verify (whose alarm(5) would replace it and alarm(0) cancel it); the slow call is
    nanoverl's timeout, counted, and the next call scores normally."""
    scores, metrics, seconds = score_batch([SLOW, "\\boxed{3}"], ["3", "3"], "reward.workers=0", "reward.timeout_s=2")
    assert scores == [0.0, 1.0] and metrics["reward/timeouts"] == 1.0 and metrics["reward/errors"] == 1.0
    assert seconds < 4.5                                     # 2 s, not math-verify's 5 s


# ---- the real entry point, pool and CLI ------------------------------------------------------------------
def test_the_reward_comes_from_the_installed_distribution_with_its_settings():
    registry = load_registry()
    entry = registry.entry("reward", "math_verify")
    assert entry.provider == "nanoverl-math"
    assert registry.settings_class("reward", "math_verify") is MathVerifySettings
    assert registry.get("reward", "math_verify") is math_verify
    listed = subprocess.run([sys.executable, "-m", "nanoverl_core.cli", "plugins", "--json"], env=ENV,
                            capture_output=True, text=True, timeout=120)
    plugin = next(p for p in json.loads(listed.stdout) if p["dist"] == "nanoverl-math")
    assert plugin["version"] == "0.4.0" and plugin["names"] == {"reward": ["math_verify"]}


def test_the_reward_scores_in_the_real_worker_pool_with_its_table():
    registry = load_registry()
    cfg = load_config(CONFIGS / "debug_reinforce.toml", ["reward.name=math_verify", "reward.workers=2", "reward.on_error=zero",
                             "reward.math_verify.correct=2.0", "reward.math_verify.no_answer=-1.0"], registry=registry)
    assert cfg.reward.settings == MathVerifySettings(correct=2.0, no_answer=-1.0)
    responses = ["#### 1,000", "\\boxed{\\frac{1}{2}}", "It is 7.", "nothing", "#### 3", "#### 3"]
    rows = [row("1000"), row("0.5"), row("8"), row("1"), {"ground_truth": "3"}, {"question": "no gold"}]
    batch = RLBatch({"x": torch.zeros(len(rows))}, {"row": rows, "prompt_text": ["q"] * len(rows),
                                                     "index": list(range(len(rows)))})
    scorer = RewardScorer(cfg.reward, registry)
    try:
        assert scorer.in_trainer == [False]                        # a per-row reward: the worker processes
        scores, metrics = score_texts(scorer, batch, responses)
        assert len(scorer.pool().workers) == 2
    finally:
        scorer.close()
    assert scores.tolist() == [2.0, 2.0, 0.0, -1.0, 2.0, 0.0]      # the row without a gold answer: an error, 0
    assert metrics["reward/errors"] == 1.0 and metrics["reward/crashes"] == 0.0
    assert metrics["reward/answer_found"] == pytest.approx(4 / 5)


def run_cli(*args: str, preamble: str = "", **env: str) -> subprocess.CompletedProcess:
    code = f"import sys\n{preamble}\nfrom nanoverl_core.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env={**ENV, **env}, capture_output=True,
                          text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("config", ["gsm8k_grpo_gpu.toml", "smollm2_gsm8k_cpu.toml"])
def test_the_gsm8k_configs_select_math_verify_with_one_override(config):
    proc = run_cli("--config", str(CONFIGS / config), "--dry-run", "reward.name=math_verify",
                   "reward.math_verify.gold_format=expr")
    assert proc.returncode == 0, proc.stderr[-2000:]
    resolved = json.loads(proc.stdout)
    assert resolved["config"]["reward"]["math_verify"]["gold_format"] == "expr"
    assert {"kind": "reward", "name": "math_verify", "provider": "nanoverl-math"} in resolved["plugins"]


@pytest.mark.parametrize("override, needle", [
    ("reward.math_verify.timeout_s=-1", "timeout_s"),
    ("reward.math_verify.gold_format=tex", "gold_format"),
    ("reward.math_verify.ground_truth_key=reward_model..ground_truth", "ground_truth_key"),
    ("reward.math_verify.correctt=1", "correct"),
    ("reward.math_verify.wrong=nan", "wrong"),
])
def test_a_bad_setting_exits_2_with_one_error_line(override, needle):
    line = one_error_line(run_cli("--config", str(CONFIGS / "debug_reinforce.toml"), "--dry-run",
                                  "reward.name=math_verify", override))
    assert needle in line and "reward.math_verify" in line, line


def test_without_math_verify_installed_selecting_it_gives_the_install_line():
    """math_verify hidden from the import system (as where only nanoverl-math's files are installed)."""
    proc = run_cli("--config", str(CONFIGS / "debug_reinforce.toml"), "--dry-run", "reward.name=math_verify",
                   preamble="sys.modules['math_verify'] = None")
    line = one_error_line(proc)
    assert "reward 'math_verify' from nanoverl-math cannot be imported" in line, line
    assert 'pip install "nanoverl[math]"' in line and 'pip install -e "plugins/nanoverl-math"' in line, line


def test_a_debug_run_trains_with_math_verify_in_the_worker_processes(tmp_path):
    """2 steps of the debug copy task (a response "0123" for the target "123" is the number 123): every
    call succeeds in the pool, and each dumped rollout's score is what the function gives for it."""
    run_dir = tmp_path / "run"
    proc = run_cli("--config", str(CONFIGS / "debug_reinforce.toml"), "reward.name=math_verify",
                   "reward.workers=2", "trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0",
                   "trainer.progress=none", "tracking.trackers=[jsonl]", "trainer.rollout_samples=-1",
                   "data.batch_size=4", "rollout.n=2", f"trainer.output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["reward/errors"] == 0 for m in metrics)
    assert all(0 <= m["reward/answer_found"] <= 1 for m in metrics)
    for step in (1, 2):
        for dumped in map(json.loads, (run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()):
            target = {"target": dumped["prompt"].removesuffix("=")}
            assert dumped["score"] == math_verify("", dumped["response"], target)["score"], dumped


def test_without_the_plugin_the_unknown_name_says_which_distribution_provides_it():
    proc = run_cli("--config", str(CONFIGS / "debug_reinforce.toml"), "--dry-run", "reward.name=math_verify",
                   NANOVERL_DISABLE_PLUGINS="nanoverl-math")
    line = one_error_line(proc)
    assert "reward.name = 'math_verify': no reward of that name is registered" in line, line
    assert 'it is provided by nanoverl-math: pip install "nanoverl[math]"' in line, line
