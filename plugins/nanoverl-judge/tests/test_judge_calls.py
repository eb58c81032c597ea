"""The judge reward called as the runtime calls it, against real judge servers on 127.0.0.1: scores, the
cache, the log, each failure kind, retries, group mode, the fallback, the key."""

from __future__ import annotations

import json
import socket

import pytest

from nanoverl_core.reward import CallError, RewardContext
from nanoverl_judge.reward import ERROR_KINDS, judge
from nanoverl_judge.settings import JudgeSettings

ROWS = [{"prompt": "660=", "target": "660"}, {"prompt": "487=", "target": "487"},
        {"prompt": "123=", "target": "123"}]
PROMPTS = [row["prompt"] for row in ROWS]


def context(run_dir, step=1, uids=("a", "b", "c")) -> RewardContext:
    return RewardContext("train", step, str(run_dir), tuple(uids), tuple(range(len(uids))))


def scores(out: list) -> list:
    return [value.kind if isinstance(value, CallError) else value["score"] for value in out]


def log_lines(run_dir) -> list[dict]:
    path = run_dir / "judge" / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_a_judge_scores_caches_and_logs_the_exact_requests(judge_server, tmp_path):
    server = judge_server("exact")
    settings = JudgeSettings(base_url=server.url, model="scripted")
    out = judge(PROMPTS, ["660", "999", "123"], ROWS, settings, context(tmp_path))
    assert scores(out) == [1.0, 0.0, 1.0] and [o["judge_cached"] for o in out] == [0.0, 0.0, 0.0]
    sent = server.requests()
    assert len(sent) == 3
    logged = log_lines(tmp_path)
    assert sorted(json.dumps(line["request"], sort_keys=True) for line in logged) == \
        sorted(json.dumps(r["body"], sort_keys=True) for r in sent)               # the exact requests, logged
    assert all(json.loads(line["reply"])["choices"][0]["message"]["content"].startswith("Score:") for line in logged)
    again = judge(PROMPTS, ["660", "999", "123"], ROWS, settings, context(tmp_path, step=2))
    assert scores(again) == [1.0, 0.0, 1.0] and [o["judge_cached"] for o in again] == [1.0, 1.0, 1.0]
    assert len(server.requests()) == 3                                            # nothing asked twice
    assert [line["cached"] for line in log_lines(tmp_path)[3:]] == [True] * 3


def test_equal_requests_in_a_step_are_sent_once(judge_server, tmp_path):
    server = judge_server("exact")
    out = judge(PROMPTS[:1] * 4, ["660", "660", "1", "660"], ROWS[:1] * 4, JudgeSettings(base_url=server.url),
                context(tmp_path, uids="aaaa"))
    assert scores(out) == [1.0, 1.0, 0.0, 1.0]
    assert len(server.requests()) == 2


@pytest.mark.parametrize("behaviour, kind", [("garbage", "judge_unparsable"), ("error", "judge_http"),
                                             ("slow", "judge_timeout")])
def test_each_failure_is_a_row_of_its_own_kind(judge_server, tmp_path, behaviour, kind):
    server = judge_server(behaviour)
    settings = JudgeSettings(base_url=server.url, timeout_s=0.5, retries=0)
    out = judge(PROMPTS, ["660", "999", "123"], ROWS, settings, context(tmp_path))
    assert scores(out) == [kind] * 3
    assert [line["kind"] for line in log_lines(tmp_path)] == [kind] * 3
    assert judge.error_kinds == ERROR_KINDS and kind in ERROR_KINDS


def test_a_server_that_is_not_there_is_unreachable(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()                                                                  # nothing listens there now
    out = judge(PROMPTS, ["660", "999", "123"], ROWS,
                JudgeSettings(base_url=f"http://127.0.0.1:{port}/v1", retries=1), context(tmp_path))
    assert scores(out) == ["judge_unreachable"] * 3
    assert [line["attempts"] for line in log_lines(tmp_path)] == [2, 2, 2]


def test_http_500_is_retried_and_failures_are_not_cached(judge_server, tmp_path):
    server = judge_server("error")
    settings = JudgeSettings(base_url=server.url, retries=2)
    judge(PROMPTS[:1], ["660"], ROWS[:1], settings, context(tmp_path, uids="a"))
    assert len(server.requests()) == 3                                            # 1 + 2 retries
    judge(PROMPTS[:1], ["660"], ROWS[:1], settings, context(tmp_path, uids="a"))
    assert len(server.requests()) == 6                                            # a failure is asked again


def test_group_mode_sends_one_request_per_group_and_scores_each_answer(judge_server, tmp_path):
    server = judge_server("exact")
    rows = [ROWS[0]] * 3 + [ROWS[1]] * 2
    out = judge([r["prompt"] for r in rows], ["660", "66", "660", "487", "0"], rows,
                JudgeSettings(base_url=server.url, mode="group"), context(tmp_path, uids="aaabb"))
    assert scores(out) == [1.0, 0.0, 1.0, 1.0, 0.0]
    sent = server.requests()
    assert len(sent) == 2 and "Answer 3:\n660" in sent[0]["body"]["messages"][-1]["content"] + \
        sent[1]["body"]["messages"][-1]["content"]


def test_a_fallback_scores_the_rows_the_judge_failed_and_says_so(judge_server, tmp_path):
    server = judge_server("garbage")
    settings = JudgeSettings(base_url=server.url, fallback="exact_match")
    out = judge(PROMPTS, ["660", "999", "123"], ROWS, settings, context(tmp_path))
    assert scores(out) == [1.0, 0.0, 1.0]
    assert all(o["fallback/judge_unparsable"] == 1.0 and o["fallback/judge_http"] == 0.0 for o in out)


def test_the_api_key_is_sent_and_written_nowhere(judge_server, tmp_path, monkeypatch):
    server = judge_server("exact")
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test-secret-1234")
    out = judge(PROMPTS, ["660", "999", "123"], ROWS, JudgeSettings(base_url=server.url, api_key_env="JUDGE_TEST_KEY"),
                context(tmp_path))
    assert scores(out) == [1.0, 0.0, 1.0]
    assert {r["auth"] for r in server.requests()} == {"Bearer sk-test-secret-1234"}
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.name.startswith("server"):
            assert b"sk-test-secret" not in path.read_bytes(), path
