"""The judge in real training runs (`nanoverl-train` on the debug backends) against real judge servers on
127.0.0.1: each failure kind counted as its own metric with the run going on, a server killed mid-run, the
cache across a SIGKILL and resume, a real small model served by the plugin, and the dry-run's error lines."""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT, cli_env, run_cli

CONFIG = str(ROOT / "examples" / "configs" / "debug_reinforce.toml")
KIND = {"exact": "ok", "garbage": "judge_unparsable", "error": "judge_http", "slow": "judge_timeout"}


def args(run_dir: Path, url: str, *extra: str, steps: int = 3) -> list[str]:
    return ["--config", CONFIG, f"trainer.total_steps={steps}", f"trainer.output_dir={run_dir}", "trainer.val_every=0",
            "trainer.progress=none", "data.batch_size=4", "rollout.n=4", "tracking.trackers=[jsonl]",
            "reward.name=judge", f"reward.judge.base_url={url}", "reward.judge.timeout_s=0.5",
            "reward.judge.retries=0", *extra]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "judge" / "requests.jsonl").read_text().splitlines()]


def test_each_failure_kind_is_its_own_metric_and_the_run_goes_on(judge_server, tmp_path):
    """A server that times out, errors, answers garbage or scores, by the request's hash: every step's
    reward/errors/<kind> is the number of rows whose request got that behaviour."""
    server = judge_server("mixed")
    run_dir = tmp_path / "run"
    proc = run_cli(*args(run_dir, server.url, "reward.on_error=zero"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    behaviour = {json.dumps(r["body"], sort_keys=True): r["behaviour"] for r in server.requests()}
    lines = logged(run_dir)
    assert all(KIND[behaviour[json.dumps(line["request"], sort_keys=True)]] == line["kind"] for line in lines)
    seen = set()
    for m in metrics(run_dir):
        counts = Counter()
        for line in lines:
            if line["step"] == m["step"]:
                counts[line["kind"]] += len(line["indices"])
        for kind in ("judge_timeout", "judge_http", "judge_unparsable", "judge_unreachable"):
            assert m[f"reward/errors/{kind}"] == counts[kind], (m["step"], kind)
            seen |= {kind} if counts[kind] else set()
        assert m["reward/errors"] == sum(v for k, v in counts.items() if k != "ok")
    assert seen == {"judge_timeout", "judge_http", "judge_unparsable"}
    kinds = {json.loads(line)["kind"] for line in (run_dir / "reward_errors.jsonl").read_text().splitlines()}
    assert kinds == seen


def test_a_judge_killed_mid_run_costs_its_rows_which_are_dropped(judge_server, tmp_path):
    server = judge_server("exact", die_after=20)
    run_dir = tmp_path / "run"
    proc = run_cli(*args(run_dir, server.url, "reward.on_error=drop"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert server.proc.wait(timeout=10) == 1
    last = metrics(run_dir)[-1]
    assert last["reward/errors/judge_unreachable"] == 16 and last["reward/dropped"] == 16
    assert last["reward/mean"] == 0.0


KILL_DRIVER = '''
"""nanoverl-train that SIGKILLs itself right after the reward stage of its KILL_AT-th step."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.trainer import trainer

score, calls = trainer.Trainer.score, [0]


def score_then_die(self, batch):
    out = score(self, batch)
    calls[0] += 1
    if calls[0] == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return out


trainer.Trainer.score = score_then_die
sys.exit(main(sys.argv[1:]))
'''


def test_the_cache_survives_a_sigkill_and_resume_asking_nothing_twice(judge_server, tmp_path):
    """Killed after step 3 was judged (checkpoint at step 2); the resumed run judges step 3 again from the
    cache: the server never sees one request twice, and the metrics equal an uninterrupted run's."""
    import subprocess

    server = judge_server("exact")
    driver = tmp_path / "kill_driver.py"
    driver.write_text(KILL_DRIVER)
    run_dir = tmp_path / "run"
    run = args(run_dir, server.url, "reward.on_error=zero", "trainer.save_every=2", "data.shuffle=false", steps=4)
    killed = subprocess.run([sys.executable, str(driver), *run], cwd=ROOT, env=cli_env(KILL_AT="3"),
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = len(server.requests())
    assert {line["step"] for line in logged(run_dir)} == {1, 2, 3}
    proc = run_cli(*run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bodies = [json.dumps(r["body"], sort_keys=True) for r in server.requests()]
    assert len(bodies) == len(set(bodies)) and len(bodies) > before          # no request asked twice
    resumed_step3 = [line for line in logged(run_dir) if line["step"] == 3][-1]
    assert resumed_step3["cached"] is True
    asked = len(bodies)
    again = tmp_path / "again"                          # the same run from scratch, on the first run's cache
    assert run_cli(*args(again, server.url, "reward.on_error=zero", "trainer.save_every=2", "data.shuffle=false",
                         f"reward.judge.cache_path={run_dir / 'judge' / 'cache.sqlite'}", steps=4)).returncode == 0
    assert len(server.requests()) == asked and all(m["reward/judge_cached"] == 1.0 for m in metrics(again))
    assert [m["reward/mean"] for m in metrics(again)] == [m["reward/mean"] for m in metrics(run_dir)][-4:]


def tiny_judge(folder: Path) -> Path:
    """A tiny random Llama with a printable-character tokenizer and a chat template, weights saved."""
    import string

    from transformers import AutoModelForCausalLM, AutoConfig
    from nanoverl_hf.tiny import build_tiny_model

    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "
    build_tiny_model(folder, alphabet=string.printable, max_positions=1024, chat_template=template)
    import torch
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def test_a_real_small_model_served_by_the_plugin_judges_and_its_garbage_is_unparsable(tmp_path):
    pytest.importorskip("nanoverl_hf")
    model = tiny_judge(tmp_path / "judge_model")
    run_dir = tmp_path / "run"
    proc = run_cli(*args(run_dir, "", "reward.on_error=drop", f"reward.judge.serve={model}",
                         "reward.judge.max_tokens=8", "reward.judge.timeout_s=60", steps=2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = logged(run_dir)
    assert lines and all(line["kind"] == "judge_unparsable" for line in lines)
    reply = json.loads(lines[0]["reply"])
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant"
    assert metrics(run_dir)[-1]["reward/errors/judge_unparsable"] == metrics(run_dir)[-1]["reward/dropped"] > 0


@pytest.mark.parametrize("override, needle, also", [
    ('reward.judge.template="Grade {response} by {answer}"', "template field {answer}", ""),   # quoted: braces
    ('reward.judge.template="Grade {response}"', "no {responses} field", "reward.judge.mode=group"),
    ("reward.judge.template_file=/nonexistent/rubric.txt", "does not exist", ""),
    ("reward.judge.api_key_env=JUDGE_TEST_UNSET_KEY", "JUDGE_TEST_UNSET_KEY", ""),
    ("reward.judge.fallback=exact_matc", "exact_match", ""),
    ("reward.judge.fallback=missing.py:f", "missing.py does not exist", ""),
    ("reward.judge.score_pattern=Score", "has 0 groups", ""),
    ("reward.judge.serve=/nonexistent/model", "not a model folder", ""),
    ("reward.judge.max_score=-1", "must be above", ""),
    ("reward.judge.base_url=http://127.0.0.1:9/v1", "is not reachable", ""),
])
def test_each_mistake_in_the_judge_settings_is_one_error_line(judge_server, tmp_path, override, needle, also):
    server = judge_server("exact")
    proc = run_cli("--dry-run", *args(tmp_path / "run", server.url, override, *filter(None, [also])))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len([line for line in lines if line.startswith("error:")]) == 1 and "Traceback" not in proc.stderr
    assert needle in lines[-1], lines[-1]
    assert not (tmp_path / "run").exists()


def test_a_good_judge_config_passes_the_dry_run(judge_server, tmp_path):
    server = judge_server("exact")
    proc = run_cli("--dry-run", *args(tmp_path / "run", server.url, 'reward.judge.template="Is {response} {target}? '
                                                                     'Score: N"'))
    assert proc.returncode == 0, proc.stderr[-2000:]
