"""`nanoverl-train` with the fixture game (written with OpenEnv's API) as the environment `openenv`, on the debug
backends: in-process in environment workers, through a server the test runs, and through one the plugin
starts; what the game saw and answered is exactly what the rollout dumps hold. Servers that die mid-run cost
episodes, counted, and the run goes on. Each user mistake is one `error:` line and exit status 2."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from conftest import CONFIG, GAME, alive, cli_env, error_line, read_jsonl, run_cli, write_rows


def train(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None, rows=lambda s: 2 + s % 2):
    data = write_rows(tmp_path / "train.jsonl", range(8), max_guesses=rows)
    run_dir = tmp_path / "run"
    proc = run_cli("--config", str(CONFIG), f"data.train_files=[{data}]", f"trainer.output_dir={run_dir}",
                   *overrides, env=env)
    return proc, run_dir


def dumped_episodes(run_dir: Path) -> Counter:
    """(seed, ((model text, reward, the answer appended after it or None), ...)) of every dumped episode; the
    seed is read from the row's prompt "<seed>:<max_guesses>?"."""
    out = Counter()
    for path in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        for row in read_jsonl(path):
            turns, answered = row["episode"], []
            for i, t in enumerate(turns):
                if t["role"] == "model" and "reward" in t:
                    after = turns[i + 1]["text"] if i + 1 < len(turns) else None
                    answered.append((t["text"], t["reward"], after))
            out[(int(row["prompt"].split(":")[0]), tuple(answered))] += 1
    return out


def game_episodes(log: Path) -> tuple[Counter, set[int]]:
    """The same, from what the game logged at each step (its answer is appended unless the step was the last),
    and the pids of the processes the game ran in."""
    steps: dict[str, list[dict]] = {}
    for record in read_jsonl(log):
        steps.setdefault(record["episode"], []).append(record)
    out = Counter()
    for records in steps.values():
        records.sort(key=lambda r: r["turn"])
        assert [r["turn"] for r in records] == list(range(len(records)))         # one session per episode
        out[(records[0]["seed"], tuple((r["text"], r["reward"], None if r["done"] else r["hint"])
                                       for r in records))] += 1
    return out, {r["pid"] for r in read_jsonl(log)}


def assert_the_game_saw_what_the_run_dumped(run_dir: Path, log: Path) -> set[int]:
    dumped, (played, pids) = dumped_episodes(run_dir), game_episodes(log)
    assert dumped == played and sum(dumped.values()) == 3 * 4 * 2               # steps x prompts x samples
    for seed, answered in dumped:
        assert len(answered) <= 2 + seed % 2                                    # the row's max_guesses reached reset
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [sum(r for _, r, _ in answered) for (_, answered), n in dumped.items() for _ in range(n)]
    assert sum(rewards) > 0 and sum(r["reward/mean"] for r in rows) * 8 == pytest.approx(sum(rewards))  # arrived
    assert all(r["episode/errors"] == 0 for r in rows)
    return pids


def test_in_process_episodes_in_environment_workers(tmp_path):
    log = tmp_path / "game.jsonl"
    proc, run_dir = train(tmp_path, f"environment.openenv.env={GAME}:GuessNumberEnv", "environment.workers=2",
                          "environment.openenv.check_prompt=true", env=cli_env(GUESS_LOG=str(log)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(assert_the_game_saw_what_the_run_dumped(run_dir, log)) == 2      # the two worker processes


def test_episodes_through_a_running_openenv_server_interleaved_in_one_worker(tmp_path, serve):
    log = tmp_path / "game.jsonl"
    server = serve(GUESS_LOG=str(log))
    proc, run_dir = train(tmp_path, f"environment.openenv.url={server.url}", "environment.workers=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert assert_the_game_saw_what_the_run_dumped(run_dir, log) == {server.proc.pid}   # the state on the server


def test_the_plugin_serves_the_app_for_the_run_and_stops_it_at_the_end(tmp_path):
    log = tmp_path / "game.jsonl"
    proc, run_dir = train(tmp_path, f"environment.openenv.app={GAME}:app", "environment.workers=2",
                          env=cli_env(GUESS_LOG=str(log)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = assert_the_game_saw_what_the_run_dumped(run_dir, log)
    assert len(pids) == 2 and not any(alive(pid, wait_s=5) for pid in pids)    # one server per worker, stopped


@pytest.mark.parametrize("where", ["url", "app"])
def test_a_server_killed_mid_run_costs_counted_episodes_and_the_run_goes_on(tmp_path, serve, where):
    """The game SIGKILLs its server at the 10th step (once): the episodes on it fail (environment.on_error =
    zero: score 0, episode/errors, reward_errors.jsonl) and the run finishes. A server the run was given stays
    down, so every later episode fails at its start; one the plugin started is started again. (grpo: a step in
    which every episode failed before its first token has no tokens, which reinforce_plus_plus's batch
    whitening refuses.)"""
    die = {"GUESS_DIE_AFTER": "10", "GUESS_DIE_MARK": str(tmp_path / "died")}
    common = ["environment.workers=1", "environment.on_error=zero", "trainer.total_steps=4",
              "algorithm.advantage_estimator=grpo"]
    if where == "url":
        server = serve(**die)
        proc, run_dir = train(tmp_path, f"environment.openenv.url={server.url}", *common)
    else:
        proc, run_dir = train(tmp_path, f"environment.openenv.app={GAME}:app", *common, env=cli_env(**die))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "died").exists()
    rows = read_jsonl(run_dir / "metrics.jsonl")
    errors = read_jsonl(run_dir / "reward_errors.jsonl")
    assert len(errors) == sum(r["episode/errors"] for r in rows) > 0
    assert all(e["reward"] == "environment" and "OpenEnv server http://127.0.0.1:" in e["message"] for e in errors)
    if where == "url":
        assert [r["episode/errors"] for r in rows][-2:] == [8, 8]              # down for good: every episode
        assert "connect: ConnectionError" in errors[-1]["message"]
    else:
        assert rows[-1]["episode/errors"] == 0                                  # started again
        assert "starting it again" in proc.stderr


def test_an_environment_that_raises_stops_the_run_with_one_line_naming_the_row(tmp_path):
    proc, run_dir = train(tmp_path, f"environment.openenv.env={GAME}:RaisingEnv")
    line = error_line(proc)
    assert "environment 'openenv' on data row" in line and "turn 0: raised KeyError: 'no step today'" in line


def _mistakes(tmp_path: Path, server_url: str) -> list[tuple[list[str], list[str]]]:
    key = "environment.openenv"
    return [
        ([], [f"config key '{key}.env'", "set exactly one of environment.openenv.env", "none is set"]),
        ([f"{key}.env={GAME}:GuessNumberEnv", f"{key}.url={server_url}"], ["env and url are both set"]),
        ([f"{key}.env=no_such_module:Env"], [f"'{key}.env'", "module 'no_such_module' does not import"]),
        ([f"{key}.env={GAME}:GuesNumberEnv"], [f"'{key}.env'", "has no 'GuesNumberEnv'; did you mean 'GuessNumberEnv'?"]),
        ([f"{key}.env={tmp_path}/missing.py:Env"], [f"'{key}.env'", "missing.py does not exist"]),
        ([f"{key}.env={GAME}:NotAnEnvironment"], ["is the class NotAnEnvironment, not an OpenEnv Environment class"]),
        ([f"{key}.env={GAME}:UnsaidEnv"], ["which Action UnsaidEnv.step takes is not said"]),
        ([f"{key}.env={GAME}:TwoTextsEnv"], ["its action TwoTextsAction has 2 text fields",
                                              "set environment.openenv.action"]),
        ([f"{key}.env={GAME}:GuessNumberEnv", f"{key}.action={GAME}:no_such_function"],
         [f"config key '{key}.action'", "has no 'no_such_function'"]),
        ([f"{key}.env={GAME}:GuessNumberEnv", f"{key}.observation=hnit"],
         [f"config key '{key}.observation'", "no field 'hnit' (its fields: hint)"]),
        ([f"{key}.url=127.0.0.1:8000"], [f"'{key}.url'", "is not a server's base URL"]),
        ([f"{key}.url={server_url}"], [f"'{key}.url'", f"no OpenEnv server answers at {server_url}",
                                       "Connection refused"]),
        ([f"{key}.app={GAME}:GuessNumberEnv"], [f"'{key}.app'", "is the class GuessNumberEnv, not an OpenEnv server app",
                                                "an Environment class is environment.openenv.env"]),
        ([f"{key}.app={GAME}:ap"], [f"'{key}.app'", "did you mean 'app'?"]),
        ([f"{key}.env={GAME}:GuessNumberEnv", f"{key}.message_timeout_s=0"], [f"'{key}.message_timeout_s'"]),
    ]


def test_each_user_mistake_is_one_error_line_naming_the_key_before_anything_is_written(tmp_path):
    from nanoverl_openenv.server import free_port

    down = f"http://127.0.0.1:{free_port()}"                                   # nothing listens there
    data = write_rows(tmp_path / "train.jsonl", range(4))
    for i, (overrides, needles) in enumerate(_mistakes(tmp_path, down)):
        run_dir = tmp_path / f"run{i}"
        for extra in (["--dry-run"], []) if i < 2 else (["--dry-run"],):
            proc = run_cli("--config", str(CONFIG), f"data.train_files=[{data}]", f"trainer.output_dir={run_dir}",
                           *overrides, *extra)
            line = error_line(proc)
            assert all(needle in line for needle in needles), (needles, line)
        assert not run_dir.exists()
