"""make_data.py: the committed rows are what the pinned textarena draws, in any process; splits share no seed."""

import json
import os
import subprocess
import sys
from pathlib import Path

from nanoverl_textarena.game import textarena_episode

PLUGIN = Path(__file__).resolve().parents[1]
SCRIPT = PLUGIN / "make_data.py"


def run(*args: str, hash_seed: str = "0") -> subprocess.CompletedProcess:
    """make_data.py in a fresh interpreter (PYTHONHASHSEED varies set and dict orders of str keys)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONHASHSEED": hash_seed})


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_committed_rows_are_what_the_generator_writes_under_another_hash_seed():
    out = run("--check", hash_seed="12345")           # they were written under a random one
    assert out.returncode == 0, out.stderr


def test_check_fails_on_a_changed_file_and_the_splits_share_no_seed(tmp_path):
    assert run("--games", "FrozenLake-v0", "Mastermind-v0", "--train", "3", "--val", "2", "--out",
               str(tmp_path)).returncode == 0
    train, val = rows(tmp_path / "train.jsonl"), rows(tmp_path / "val.jsonl")
    assert [(r["extra_info"]["env_id"], r["extra_info"]["seed"]) for r in train] == \
        [("FrozenLake-v0", s) for s in range(3)] + [("Mastermind-v0", s) for s in range(3)]
    assert {r["extra_info"]["seed"] for r in train}.isdisjoint(r["extra_info"]["seed"] for r in val) and len(val) == 4
    lakes = [r["prompt"][1]["content"] for r in train[:3] + val[:2]]
    assert len(set(lakes)) == 5                        # FrozenLake draws its lake from the seed: five games
    for r in train + val:                              # every row starts its own game (the prompt check passes)
        assert r["data_source"] == f"textarena/{r['extra_info']['env_id']}"
        textarena_episode(r).close()
    args = ["--games", "FrozenLake-v0", "Mastermind-v0", "--train", "3", "--val", "2", "--out", str(tmp_path)]
    assert run(*args, "--check").returncode == 0
    (tmp_path / "val.jsonl").write_text(json.dumps(val[1]) + "\n" + json.dumps(val[0]) + "\n" +
                                        "".join(json.dumps(r) + "\n" for r in val[2:]))
    out = run(*args, "--check")
    assert out.returncode == 1 and "val.jsonl" in out.stderr and "train.jsonl" not in out.stderr


def test_a_game_that_cannot_be_played_is_one_error_line_and_exit_2(tmp_path):
    for game, needle in [("GuessTheNumbr-v0", "closest: GuessTheNumber-v0"),
                         ("ConnectFour-v0", "does not start for one player")]:
        out = run("--games", game, "--out", str(tmp_path))
        assert out.returncode == 2 and out.stderr.startswith("error: ") and needle in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())               # nothing written
