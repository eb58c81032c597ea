"""Multi-turn episodes on the core's debug backends: exact tokens, masks, rewards, failures, learning, resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import attrs
import pytest
import torch

from conftest import EXAMPLES, ROOT, assert_identical_runs, assert_user_error, cli_env, read_metrics, run_cli
from nanoverl_core.batch import RLBatch
from nanoverl_core.builtins.debug import make_rollout, make_workers
from nanoverl_core.builtins.debug_settings import DebugRolloutSettings
from nanoverl_core.builtins.environments import calculate, calculator
from nanoverl_core.config import Config
from nanoverl_core.data import collate, load_prompts
from nanoverl_core.env import EnvStep, EpisodeRollout, InProcess, Turn, episode_metrics
from nanoverl_core.env.tools import parse_calls
from nanoverl_core.errors import EpisodeError
from nanoverl_core.rollout import SamplingParams
from nanoverl_core.testing import score_texts

TURNS = str(EXAMPLES / "debug_copy_turns.toml")
COPY = ROOT / "examples" / "data" / "debug_copy"
QUIET = "trainer.progress=none"


class Recorder:
    """The debug rollout, with every call's prompts and sampled ids kept (what the sampler produced)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.returns_log_probs = engine.returns_log_probs

    def generate(self, batch, params):
        out = self.engine.generate(batch, params)
        prompts = [row[mask.bool()].tolist() for row, mask in zip(batch["prompts"], batch["prompt_mask"])]
        sampled = [row[:int(n)].tolist() for row, n in zip(out["responses"], out["response_mask"].sum(-1))]
        self.calls.append({"prompts": prompts, "sampled": sampled, "log_probs": out["rollout_log_probs"].clone(),
                           "max_new_tokens": params.max_new_tokens})
        return out

    def sync_weights(self, actor):
        self.engine.sync_weights(actor)

    def close(self):
        self.engine.close()


@attrs.define
class Echo:
    """Answers every turn with `answer`, rewards turn k with k + 1, is done after `done_after` turns."""

    answer: str = ":"
    done_after: int = 99
    fail_at: int = -1

    def step(self, turn: Turn) -> EnvStep:
        if turn.index == self.fail_at:
            raise RuntimeError("the environment broke")
        return EnvStep(observation=self.answer, reward=float(turn.index + 1), done=turn.index + 1 >= self.done_after,
                       info={"echoes": 1.0})


def _setup(tmp_path, *, budget=24, max_turns=3, make_env=lambda row: Echo(), **env):
    config = Config()
    config.trainer.output_dir = str(tmp_path)
    config.rollout.max_new_tokens = budget
    config.rollout.settings = DebugRolloutSettings(log_probs=True)
    config.environment = attrs.evolve(config.environment, name="echo", max_turns=max_turns, **env)
    workers = make_workers(config)
    engine = Recorder(make_rollout(config, workers))
    rollout = EpisodeRollout(engine, InProcess(make_env, None, config.environment.timeout_s), config,
                             workers.tokenizer, name="echo")
    data = load_prompts([str(COPY / "train.jsonl")], config.data, workers.tokenizer)
    batch = collate(data, list(range(6)), workers.tokenizer.pad_token_id, "data_source")
    return config, workers, engine, rollout, batch


def test_model_turns_are_the_samplers_ids_and_each_turn_is_fed_the_episode_so_far(tmp_path):
    torch.manual_seed(0)
    config, workers, engine, rollout, batch = _setup(tmp_path, max_turn_tokens=4)   # 3 turns fit the budget
    out = rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    colon = workers.tokenizer.encode(":")
    assert len(engine.calls) == 3                                  # max_turns model turns, every episode live
    for row in range(len(batch)):
        prompt = batch["prompts"][row][batch["prompt_mask"][row].bool()].tolist()
        expected, model = [], []
        for call in engine.calls:
            assert call["prompts"][row] == prompt + expected       # token-in: the episode so far, as ids
            expected += call["sampled"][row]
            model += [1.0] * len(call["sampled"][row])
            if call is not engine.calls[-1]:                        # the answer to the last turn is not appended
                expected += colon
                model += [0.0] * len(colon)
        n = len(expected)
        assert out["responses"][row, :n].tolist() == expected      # token-out: bit for bit
        assert out["model_mask"][row, :n].tolist() == model and out["model_mask"][row, n:].sum() == 0
        assert out["response_mask"][row].sum() == n and not out["truncated"][row]
        # the engine's log-probs sit on the model's tokens, 0 on the environment's
        sampled = torch.cat([call["log_probs"][row, :len(call["sampled"][row])] for call in engine.calls])
        assert torch.equal(out["rollout_log_probs"][row][out["model_mask"][row].bool()], sampled)
        assert out["rollout_log_probs"][row][(out["response_mask"][row] - out["model_mask"][row]).bool()].eq(0).all()
        # each reward (turn k: k + 1) on the last token of the turn it answered
        ends = (torch.tensor(model + [0.0]).diff() == -1).nonzero().flatten().tolist()    # a 1 followed by a 0
        assert out["turn_rewards"][row].nonzero().flatten().tolist() == ends
        assert out["turn_rewards"][row, ends].tolist() == [1.0, 2.0, 3.0]
    assert out["num_turns"].tolist() == [3] * 6 and out["episode"][0][1] == {"role": "environment", "text": ":",
                                                                               "tokens": 1}
    # the trainer's own log-probs of the episode agree with the sampler's on every model token
    trainer_lp = workers.actor.compute_log_probs(RLBatchView.of(batch, out))
    mask = out["model_mask"].bool()
    assert torch.allclose(trainer_lp[mask], out["rollout_log_probs"][mask], atol=1e-5)
    assert episode_metrics(out) == {"episode/turns/mean": 3.0, "episode/env_tokens/mean": 2.0, "episode/errors": 0.0,
                                    "episode/echoes/mean": 3.0, "episode/echoes/rate": 1.0}


class RLBatchView:
    @staticmethod
    def of(batch, out):
        merged = batch.index(list(range(len(batch))))
        merged.update(out)
        return merged


def test_episodes_end_when_done_at_max_turns_or_out_of_budget(tmp_path):
    torch.manual_seed(0)
    # done after one turn: one engine call, nothing appended
    _, _, engine, rollout, batch = _setup(tmp_path, make_env=lambda row: Echo(done_after=1))
    out = rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    assert len(engine.calls) == 1 and out["model_mask"].equal(out["response_mask"]) and out["num_turns"].eq(1).all()
    # a budget of 5 tokens: turns are asked for what is left, a turn cut by the budget ends the episode truncated
    _, _, engine, rollout, batch = _setup(tmp_path, budget=5, max_turns=9, make_env=lambda row: Echo(answer="::"))
    out = rollout.generate(batch, SamplingParams(max_new_tokens=5, temperature=1.0))
    assert engine.calls[0]["max_new_tokens"] == 5 and out["response_mask"].sum(-1).le(5).all()
    assert out["truncated"].any()
    for row in range(len(batch)):
        n = int(out["response_mask"][row].sum())
        stopped = out["responses"][row, n - 1] == 1 and out["model_mask"][row, n - 1] == 1
        assert bool(out["truncated"][row]) != bool(stopped) or n < 5
    # max_turn_tokens caps every turn
    _, _, engine, rollout, batch = _setup(tmp_path, max_turn_tokens=2)
    rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    assert [c["max_new_tokens"] for c in engine.calls] == [2, 2, 2]


def test_a_failing_environment_names_the_row_and_turn_or_scores_zero(tmp_path):
    torch.manual_seed(0)
    _, _, _, rollout, batch = _setup(tmp_path, max_turn_tokens=4, make_env=lambda row: Echo(fail_at=1))
    with pytest.raises(EpisodeError, match=r"environment 'echo' on data row 0, turn 1: raised RuntimeError: the "
                                           r"environment broke; .*environment.on_error=zero"):
        rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    config, workers, _, rollout, batch = _setup(tmp_path, on_error="zero", max_turn_tokens=4,
                                                  make_env=lambda row: Echo(fail_at=1))
    out = rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
    assert out["episode_failed"].all() and out["num_turns"].eq(2).all()
    assert out["episode_error"][0].startswith("raised: environment 'echo' on data row 0, turn 1")
    from nanoverl_core.plugins import load_registry
    from nanoverl_core.reward import RewardScorer
    batch.update(out)
    scorer = RewardScorer(config.reward, load_registry(), run_dir=tmp_path)
    scored, metrics = scorer.score_batch(batch, workers.tokenizer, step=3)
    assert scored["score"].eq(0).all() and scored["token_level_scores"].eq(0).all()
    errors = [json.loads(line) for line in (tmp_path / "reward_errors.jsonl").read_text().splitlines()]
    assert len(errors) == 6 and errors[0]["reward"] == "environment" and errors[0]["step"] == 3
    assert errors[0]["episode"][0]["role"] == "model" and "turn 1" in errors[0]["message"]


def test_an_environment_that_hangs_or_answers_nonsense_is_a_failure_not_a_stall(tmp_path):
    class Hangs:
        def step(self, turn):
            time.sleep(30)

    class Nonsense:
        def step(self, turn):
            return {"observation": "x"}

    for make_env, needle in ((lambda row: Hangs(), "turn 0: timed out after environment.timeout_s=0.5s"),
                             (lambda row: Nonsense(), "turn 0: step() returned dict, not nanoverl_core.env.EnvStep"),
                             (lambda row: Echo(answer="x"), "turn 0: its answer cannot be rendered: the debug "
                                                            "tokenizer has no token for ['x']")):
        _, _, _, rollout, batch = _setup(tmp_path, timeout_s=0.5, make_env=make_env)
        start = time.perf_counter()
        with pytest.raises(EpisodeError) as info:
            rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0))
        assert needle in str(info.value) and time.perf_counter() - start < 10


def test_scores_add_the_answer_reward_and_the_environments_turn_rewards(tmp_path):
    """score = [reward] on the last model turn (on its last token) + each environment reward on its turn."""
    from nanoverl_core.plugins import load_registry
    from nanoverl_core.reward import RewardScorer

    torch.manual_seed(0)
    config, workers, _, rollout, batch = _setup(tmp_path, reward_weight=0.5, max_turn_tokens=4)
    batch.update(rollout.generate(batch, SamplingParams(max_new_tokens=24, temperature=1.0)))
    config.reward.name, config.reward.workers = "char_match", 0
    scorer = RewardScorer(config.reward, load_registry(), run_dir=tmp_path)
    scored, _ = scorer.score_batch(batch, workers.tokenizer)
    rows = RLBatch(non_tensors={key: batch[key] for key in ("prompt_text", "row", "index")})
    answer, _ = score_texts(scorer, rows, list(batch["final_text"]))          # the last model turn alone
    assert torch.allclose(scored["score"], answer + 0.5 * (1 + 2 + 3))
    last_model = [int(row.nonzero().max()) for row in batch["model_mask"]]
    for row, last in enumerate(last_model):
        expected = batch["turn_rewards"][row].clone()
        expected[last] += answer[row]
        assert torch.allclose(scored["token_level_scores"][row], expected)
    off = RewardScorer(config.reward, load_registry(), run_dir=tmp_path, score_answer=False)
    assert torch.allclose(off.score_batch(batch, workers.tokenizer)[0]["score"], torch.full((6,), 3.0))


@pytest.fixture(scope="module")
def turns_run(tmp_path_factory):
    """examples/configs/debug_copy_turns.toml, trained as a user runs it (~1 min)."""
    run_dir = tmp_path_factory.mktemp("turns") / "run"
    proc = run_cli("--config", TURNS, QUIET, f"trainer.output_dir={run_dir}", "trainer.rollout_samples=2")
    assert proc.returncode == 0, proc.stderr
    return run_dir


def test_the_multiturn_twin_of_the_copy_task_learns_through_the_cli(turns_run):
    tmp_path = turns_run
    rows = read_metrics(tmp_path)
    # measured (seed 0): val 0.59 at step 100 and 0.94 at 150; the first steps' reward is ~0.1
    assert rows[-1]["val/reward/mean"] >= 0.8, rows[-1]
    assert sum(r["reward/mean"] for r in rows[:10]) / 10 < 0.3
    assert rows[-1]["episode/turns/mean"] == 2.0 and rows[-1]["episode/env_tokens/mean"] == 1.0
    dump = [json.loads(line) for line in (tmp_path / "rollouts" / "step_150.jsonl").read_text().splitlines()]
    assert [t["role"] for t in dump[0]["episode"]] == ["model", "environment", "model"]


def test_eval_runs_the_same_episodes_as_validation(turns_run):
    """`nanoverl-train eval` of the last checkpoint: greedy episodes score exactly what validation logged at
    that step (the same rollout, environment and scoring), and more than the untrained model."""
    scores = {}
    for name, extra in (("base", []), ("trained", ["--checkpoint", str(turns_run)])):
        proc = run_cli("eval", "--config", TURNS, "--json", *extra)
        assert proc.returncode == 0, proc.stderr[-2000:]
        scores[name] = json.loads(proc.stdout)["results"]["greedy"]
    last = read_metrics(turns_run)[-1]
    assert scores["trained"]["reward/mean"] == pytest.approx(last["val/reward/mean"])
    assert scores["trained"]["reward/mean"] > scores["base"]["reward/mean"] + 0.3, scores
    # the episode metrics of training, over the validation episodes: every one has its 2 turns
    assert scores["trained"]["episode/turns/mean"] == last["val/episode/turns/mean"] == 2.0
    assert scores["trained"]["episode/env_tokens/mean"] == 1.0 and scores["trained"]["episode/errors"] == 0.0


def _environment_tokens(rows: list[dict]) -> float:
    """Environment tokens per episode, counted by hand from the episodes' turns."""
    return sum(t["tokens"] for r in rows for t in r["episode"] if t["role"] == "environment") / len(rows)


def test_environment_tokens_are_counted_from_the_rollout_with_truncated_rows_masked(tmp_path):
    """algorithm.mask_truncated takes a truncated episode's model tokens out of the loss_mask; the episode
    metrics still count what the rollout produced: environment tokens per episode equal a hand count of the
    episodes' environment turns, in training and in validation (the same evaluation code)."""
    args = ["--config", TURNS, QUIET, "trainer.total_steps=1", "trainer.val_every=0", "trainer.save_every=0",
            "rollout.max_new_tokens=5", "algorithm.mask_truncated=true"]            # 6 tokens do not fit: truncated
    proc = run_cli(*args, f"trainer.output_dir={tmp_path / 'run'}", "trainer.rollout_samples=-1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    metrics = read_metrics(tmp_path / "run")[-1]
    assert metrics["rollout/truncated_frac"] > 0                                  # the case that masks tokens
    assert metrics["episode/env_tokens/mean"] == pytest.approx(_environment_tokens(rows))
    samples = tmp_path / "samples.jsonl"
    proc = run_cli("eval", *args, "--json", "--samples", str(samples))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results, evaluated = json.loads(proc.stdout)["results"], [json.loads(x) for x in samples.read_text().splitlines()]
    for decoding in results:                                                       # greedy, and sampled
        rows = [r for r in evaluated if r["decoding"] == decoding]
        assert results[decoding]["episode/env_tokens/mean"] == pytest.approx(_environment_tokens(rows)), decoding


KILL_DRIVER = '''
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.env import episode

calls = 0
generate, model_turn = episode.EpisodeRollout.generate, episode.EpisodeRollout._model_turn


def counting(self, *args):
    global calls
    calls += 1
    return generate(self, *args)


def killing(self, *args):
    turn = args[-1]                                              # _model_turn(..., turn)
    if calls == int(os.environ["KILL_AT_STEP"]) and turn == 1:     # the step's second turn, mid-rollout
        os.kill(os.getpid(), signal.SIGKILL)
    return model_turn(self, *args)


episode.EpisodeRollout.generate, episode.EpisodeRollout._model_turn = counting, killing
sys.exit(main(sys.argv[1:]))
'''


def test_a_sigkill_mid_episode_resumes_to_the_identical_run(tmp_path):
    args = ["--config", TURNS, QUIET, "trainer.total_steps=4", "trainer.save_every=1", "trainer.val_every=0"]
    reference = run_cli(*args, f"trainer.output_dir={tmp_path / 'reference'}")
    assert reference.returncode == 0, reference.stderr
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(driver), *args, f"trainer.output_dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=cli_env(KILL_AT_STEP="3"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = run_cli(*args, f"trainer.output_dir={run_dir}")
    assert resumed.returncode == 0 and "(step 2)" in resumed.stderr, resumed.stderr[-2000:]
    assert_identical_runs(tmp_path / "reference", run_dir)


def test_tool_calls_are_parsed_run_and_malformed_ones_answered():
    assert parse_calls('ok <tool_call>{"name": "calculate", "arguments": {"expression": "2*3"}}</tool_call>') == \
        [{"name": "calculate", "arguments": {"expression": "2*3"}}]
    assert parse_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>') == \
        [{"name": "f", "arguments": {"x": 1}}]                     # arguments as a JSON string
    bad = parse_calls('<tool_call>{"name": 3}</tool_call> <tool_call>{nope</tool_call> <tool_call>{"name": "f"')
    assert len(bad) == 3 and all(isinstance(b, str) for b in bad)
    assert "not valid JSON" in bad[1] and "no closing" in bad[2]
    env = calculator({"prompt": "x"})
    turn = Turn('<tool_call>{"name": "calculate", "arguments": {"expression": "37 * (12 - 5)"}}</tool_call>'
                '<tool_call>{"name": "calculate", "arguments": {"expr": "1"}}</tool_call>'
                '<tool_call>{"name": "search", "arguments": {}}</tool_call>', (), 0)
    step = env.step(turn)
    assert not step.done and step.info == {"tool_calls": 3.0, "tool_errors": 2.0}
    assert step.observation[0] == {"role": "tool", "content": "259"}
    assert step.observation[1]["content"].startswith("error: TypeError")
    assert step.observation[2]["content"] == "error: there is no tool 'search'; tools: calculate"
    assert env.step(Turn("The answer is 259.", (), 1)) == EnvStep(done=True)   # no call: the final answer


def test_episode_counters_are_logged_per_episode_and_as_the_share_of_episodes_using_them():
    batch = RLBatch({"num_turns": torch.tensor([2, 1, 3, 1]), "episode_failed": torch.tensor([False, False, True, False]),
                     "response_mask": torch.tensor([[1, 1, 1, 0]] * 4), "model_mask": torch.tensor([[1, 0, 1, 0]] * 4),
                     "episode_info": [{"tool_calls": 1.0}, {}, {"tool_calls": 2.0, "tool_errors": 2.0}, {}]})
    assert episode_metrics(batch) == {"episode/turns/mean": 1.75, "episode/env_tokens/mean": 1.0, "episode/errors": 1.0,
                                      "episode/tool_calls/mean": 0.75, "episode/tool_calls/rate": 0.5,
                                      "episode/tool_errors/mean": 0.5, "episode/tool_errors/rate": 0.25}
    assert calculate("7 // 2 + 10 / 4") == "5.5" and calculate("-3*-3") == "9"
    for bad_expression in ("__import__('os')", "2**99", "9" * 7 + "*" + "9" * 7):
        with pytest.raises(ValueError):
            calculate(bad_expression)


def test_a_failing_environment_plugin_through_the_cli_is_one_line_or_scored_zero(faults_site, tmp_path):
    env = cli_env(PYTHONPATH=str(faults_site))
    args = ["--config", TURNS, QUIET, "trainer.total_steps=2", "trainer.val_every=0", "environment.name=raises_at_turn_1"]
    proc = run_cli(*args, f"trainer.output_dir={tmp_path / 'a'}", env=env)
    assert_user_error(proc, "environment 'raises_at_turn_1' on data row", "turn 1: raised ValueError",
                      "environment.on_error=zero")
    proc = run_cli(*args, "environment.on_error=zero", f"trainer.output_dir={tmp_path / 'b'}", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    failed = sum(row["episode/errors"] for row in read_metrics(tmp_path / "b"))
    written = (tmp_path / "b" / "reward_errors.jsonl").read_text().splitlines()
    assert failed > 0 and len(written) == failed and all('"reward": "environment"' in line for line in written)


@pytest.mark.parametrize("name, kind", [("crashes_on_seven", "exited with status 3"),
                                        ("hangs_on_seven", "timed out after environment.timeout_s=2s")])
def test_an_environment_that_crashes_or_hangs_its_worker_costs_episodes_not_the_run(faults_site, tmp_path, name,
                                                                                     kind):
    """In worker processes (environment.workers, the default 2): the episode whose environment kills its worker
    or hangs fails with that reason, the other episodes its worker held are lost, a fresh worker takes the next
    batch, and the run goes on (on_error = zero) or stops with one line naming the row and turn (raise)."""
    def env(run: str):                                  # one episode of the run fails: the first that can
        return cli_env(PYTHONPATH=str(faults_site), NANOVERL_TEST_ONCE=str(tmp_path / f"{run}.once"))
    args = ["--config", TURNS, QUIET, "trainer.total_steps=2", "trainer.val_every=0", f"environment.name={name}",
            "environment.timeout_s=2", "environment.max_turn_tokens=1", "trainer.save_every=0"]
    proc = run_cli(*args, f"trainer.output_dir={tmp_path / 'a'}", env=env("a"))
    assert_user_error(proc, f"environment '{name}' on data row", "turn 1: ", kind)
    proc = run_cli(*args, "environment.on_error=zero", f"trainer.output_dir={tmp_path / 'b'}", env=env("b"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_metrics(tmp_path / "b")
    errors = [json.loads(line) for line in (tmp_path / "b" / "reward_errors.jsonl").read_text().splitlines()]
    assert len(errors) == sum(r["episode/errors"] for r in rows) > 1
    failed = [e for e in errors if e["kind"] != "lost"]
    assert len(failed) == 1 and failed[0]["kind"] == ("crash" if "exited" in kind else "timeout")
    assert failed[0]["row"]["target"].startswith("7") and kind in failed[0]["message"]
    # the episodes its worker held were lost (the others of a 2-worker pool: about half); the rest were scored
    assert 0 < sum(r["episode/errors"] for r in rows) <= 128 and rows[-1]["episode/errors"] == 0
    assert rows[-1]["reward/mean"] > 0


@pytest.fixture(scope="module")
def faults_site(tmp_path_factory):
    from conftest import FIXTURES

    site = tmp_path_factory.mktemp("faults-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(FIXTURES / "nanoverl-fixture-faults")], check=True, capture_output=True)
    return site
