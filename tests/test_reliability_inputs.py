"""Bad input through the real CLI: every user mistake exits 2 with one `error:` line saying what and
where, or is a documented, logged skip. Cases already pinned in test_cli.py / test_config.py /
test_data.py / test_plugins.py are not repeated here (see docs/faults.md for the whole catalogue).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, FIXTURES, ROOT, assert_user_error, cli_env, read_metrics, run_cli

PPO = str(EXAMPLES / "debug_ppo.toml")
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
TINY = str(EXAMPLES / "tiny_grpo.toml")
TINY_MODEL = ROOT / "examples" / "tiny_task" / "model"
# one short step of the core-only REINFORCE++ config: 4 prompts x 2 samples, no validation
FAST = ["trainer.progress=none", "trainer.total_steps=1", "trainer.save_every=0", "data.val_files=[]",
        "data.batch_size=4", "rollout.n=2", "tracking.trackers=[jsonl]"]


def train(config: str, *overrides: str, run_dir: Path, env=None, timeout: float = 300):
    return run_cli("--config", config, *overrides, f"trainer.output_dir={run_dir}", env=env, timeout=timeout)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def copy_rows(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


# ---- config files --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text", [
    ("bad.yaml", "trainer:\n  total_steps: [3\n"),
    ("bad.json", '{"trainer": {"total_steps": 3,}}'),
])
def test_unparsable_yaml_and_json_configs_name_the_file(tmp_path, name, text):
    bad = write(tmp_path / name, text)
    assert_user_error(run_cli("--config", str(bad), "--dry-run"), str(bad), "cannot be parsed")


@pytest.mark.parametrize("name, text, needles", [
    ("c.ini", "[trainer]\n", ["must end in .toml, .yaml, .yml or .json"]),
    ("list.yaml", "- trainer\n- data\n", ["must hold a mapping of sections", "list"]),
])
def test_config_file_of_the_wrong_kind(tmp_path, name, text, needles):
    bad = write(tmp_path / name, text)
    assert_user_error(run_cli("--config", str(bad), "--dry-run"), str(bad), *needles)


@pytest.mark.parametrize("text, needles", [
    ('[trainer]\ntotal_step = 3\n', ["'trainer.total_step'", "did you mean 'trainer.total_steps'"]),
    ('[trainerr]\ntotal_steps = 3\n', ["'trainerr'", "did you mean 'trainer'"]),
    ('[data]\ntrain_files = ["x.jsonl"]\n[actor]\nlr = "fast"\n', ["'actor.lr'", "expected float"]),
    ('[data]\ntrain_files = ["x.jsonl"]\n[tracking]\ntrackers = "jsonl"\n', ["'tracking.trackers'", "expected list"]),
    ('trainer = 3\n', ["'trainer' is a section"]),
    ('[data]\ntrain_files = ["x.jsonl"]\n[critic]\nenable = 1\n', ["'critic.enable'", "expected bool"]),
], ids=["key-typo", "section-typo", "string-for-float", "string-for-list", "value-for-section", "int-for-bool"])
def test_unknown_keys_and_wrong_types_in_a_file_name_the_key_path(tmp_path, text, needles):
    cfg = write(tmp_path / "c.toml", text)
    assert_user_error(run_cli("--config", str(cfg), "--dry-run"), *needles)


@pytest.mark.parametrize("overrides, needles", [
    (["critic.lr=0.1"], ["critic.lr is set but critic.enable = false"]),
    (["data.batch_size=16", "actor.mini_batch_size=5"], ["actor.mini_batch_size = 5 must divide"]),
    (["trainer.keep_checkpoints=0"], ["'trainer.keep_checkpoints': 0 is not an integer >= 1"]),
    (["rollout.top_p=1.5"], ["'rollout.top_p': 1.5 is not a finite number in (0, 1]"]),
    (["reward.timeout_s=-1"], ["'reward.timeout_s': -1.0 is not a finite number >= 0"]),
    (["actor.lr=nan"], ["'actor.lr': nan is not a finite number >= 0"]),                 # once accepted, and trained
    (["actor.lr=inf"], ["'actor.lr': inf is not a finite number >= 0"]),
    (["actor.clip_ratio_low=1.5"], ["'actor.clip_ratio_low': 1.5 is not a finite number in [0, 1)"]),  # 1 - 1.5 < 0
    (["environment.name=calculator", "environment.max_turns=0"],                          # a nested table's domain
     ["'environment.max_turns': 0 is not an integer >= 1"]),
    (["algorithm.rollout_correction.rs_threshold_low=0"],
     ["'algorithm.rollout_correction.rs_threshold_low': 0.0 is not a finite number > 0 (or unset)"]),
    (["actor.betas=[0.9,1.0]"], ["'actor.betas': [0.9, 1.0] is not two numbers in [0, 1)"]),
    (["trainer.on_nonfinite=ignore"], ["trainer.on_nonfinite"]),
])
def test_impossible_combinations_exit_2_through_the_cli(overrides, needles):
    assert_user_error(run_cli("--config", REINFORCE, *overrides, "--dry-run"), *needles)


def test_path_keys_of_the_wrong_kind_exit_2_before_anything_is_written(tmp_path):
    """Each once ended in a traceback: a file as the output folder (FileExistsError), a data file or a
    folder as the reward module (AttributeError), an output folder that cannot be made."""
    a_file = write(tmp_path / "a_file", "")
    data = str(ROOT / "examples" / "data" / "debug_copy" / "train.jsonl")
    for overrides, needles in [
        ([f"trainer.output_dir={a_file}"], ["'trainer.output_dir'", "is a file, not a folder"]),
        ([f"reward.file={data}"], ["'reward.file'", "is a .jsonl file, not a Python module (.py)"]),
        ([f"reward.file={tmp_path}"], ["'reward.file'", "is a folder, not a Python module (.py)"]),
        ([f"trainer.output_dir={a_file}/run"], ["trainer.output_dir", "cannot be created", "write to"]),
    ]:
        proc = run_cli("--config", REINFORCE, *FAST, *overrides)
        assert_user_error(proc, *needles)
    text = Path(REINFORCE).read_text().replace('name = "char_match"', "") + f'\n[[reward.components]]\nfile = "{data}"\n'
    components = write(tmp_path / "c.toml", text)
    assert_user_error(run_cli("--config", str(components), *FAST),
                      "'reward.components[0].file'", "not a Python module")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "c.toml"]
    assert_user_error(run_cli("--config", REINFORCE, *FAST, f"data.train_files=[{tmp_path}]",
                              f"trainer.output_dir={tmp_path / 'run'}"),
                      "data.train_files", "is a folder, not a data file")  # once "does not exist"
    weights = write(tmp_path / "model.bin", "")
    for overrides, needles in [
        ([f"model.path={weights}"], ["'model.path'", "is a .bin file: not a Hugging Face model folder or a .gguf file"]),
        ([f"model.path={tmp_path}"], ["'model.path'", "holds no config.json"]),
        ([f"model.tokenizer_path={weights}"], ["'model.tokenizer_path'", "is a file, not a folder"]),
    ]:
        assert_user_error(run_cli("--config", REINFORCE, *FAST, *overrides, f"trainer.output_dir={tmp_path / 'run'}"),
                          *needles)
    assert not (tmp_path / "run").exists()
    # a name the OS refuses to look up (ENAMETOOLONG from stat) is not a wrong kind: the reader reports it (the
    # dry-run reads the data as the run does; it loads no model)
    too_long = run_cli("--config", REINFORCE, "--dry-run", "model.path=" + "x" * 5000)
    assert too_long.returncode == 0, too_long.stderr[-2000:]
    assert_user_error(run_cli("--config", REINFORCE, "--dry-run", "data.val_files=[" + "y" * 5000 + "]"),
                      "data.val_files", "cannot be opened")


# ---- model --------------------------------------------------------------------------------------
@pytest.mark.hf
def test_hf_config_with_a_model_path_that_points_nowhere(tmp_path):
    proc = train(TINY, *FAST, f"model.path={tmp_path}/no-such-model", run_dir=tmp_path / "run")
    assert_user_error(proc, "model.path", "no-such-model", "does not exist")


@pytest.mark.hf
def test_hf_tokenizer_without_a_pad_token_pads_with_eos_and_says_so(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(TINY_MODEL, model)
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    tok_cfg.pop("pad_token")
    (model / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    proc = train(TINY, *FAST, f"model.path={model}", "algorithm.advantage_estimator=reinforce_plus_plus",
                 run_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the tokenizer has no pad token; padding with EOS" in proc.stderr
    assert len(read_metrics(tmp_path / "run")) == 1


# ---- data ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, content, needles", [
    ("empty.jsonl", "", ["data.train_files", "empty.jsonl has no rows"]),
    ("cut.jsonl", '{"prompt": "12=", "target": "12"}\n{"prompt": "3', ["data.train_files", "cut.jsonl cannot be read"]),
    ("rows.csv", "prompt,target\n12=,12\n", ["'data.train_files'", "rows.csv' is a .csv file, not a data file"]),
    ("letters.jsonl", '{"prompt": "copy 12=", "target": "12"}\n' * 8, ["letters.jsonl row 0", "no token for", "copy 12="]),
], ids=["empty", "truncated-json", "unsupported-format", "untokenizable"])
def test_unusable_training_data_names_the_file(tmp_path, name, content, needles):
    data = write(tmp_path / name, content)
    proc = train(REINFORCE, *FAST, f"data.train_files=[{data}]", run_dir=tmp_path / "run")
    assert_user_error(proc, *needles)


def test_missing_validation_file_names_its_key(tmp_path):
    proc = train(REINFORCE, *FAST, "data.val_files=[nowhere/val.jsonl]", run_dir=tmp_path / "run")
    assert_user_error(proc, "data.val_files", "nowhere/val.jsonl does not exist")


def test_every_prompt_over_the_length_limit_is_an_error(tmp_path):
    proc = train(REINFORCE, *FAST, "data.max_prompt_length=3", run_dir=tmp_path / "run")  # prompts are "660=": 4
    assert_user_error(proc, "every prompt is longer than data.max_prompt_length=3")


def test_some_prompts_over_the_limit_are_skipped_with_a_count(tmp_path):
    rows = [{"prompt": f"{i:03d}=", "target": f"{i:03d}"} for i in range(12)]
    rows += [{"prompt": f"{i:03d}{i:03d}=", "target": "x"} for i in range(5)]  # 7 characters: over the limit
    data = copy_rows(tmp_path / "mixed.jsonl", rows)
    proc = train(REINFORCE, *FAST, f"data.train_files=[{data}]", "data.max_prompt_length=5", run_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: data.train_files: dropped 5 of 17 prompts longer than data.max_prompt_length=5" in proc.stderr
    assert len(read_metrics(tmp_path / "run")) == 1


# ---- reward functions (reward.file) ---------------------------------------------------------------
BAD_REWARDS = {
    "raises": ("def compute_score(prompt, response, sample):\n    return 1 / 0\n",
               ["raised ZeroDivisionError"]),
    "nan": ("def compute_score(prompt, response, sample):\n    return float('nan')\n",
            ["non-finite or non-numeric 'score': nan"]),
    "wrong-type": ("def compute_score(prompt, response, sample):\n    return 'ok'\n",
                   ["returned str 'ok'", "a reward must return a float"]),
    "dict-without-score": ("def compute_score(prompt, response, sample):\n    return {'acc': 1.0}\n",
                           ["dict without 'score'"]),
    "hangs": ("def compute_score(prompt, response, sample):\n    while True:\n        pass\n",
              ["timed out after reward.timeout_s=0.5s"]),
}


@pytest.mark.parametrize("kind", list(BAD_REWARDS))
def test_bad_reward_with_on_error_raise_names_reward_and_row(tmp_path, kind):
    source, needles = BAD_REWARDS[kind]
    reward = write(tmp_path / "my_reward.py", source)
    proc = train(REINFORCE, *FAST, f"reward.file={reward}", "reward.timeout_s=0.5", "reward.on_error=raise",
                 run_dir=tmp_path / "run", timeout=120)
    line = assert_user_error(proc, f"reward {reward}:compute_score", "data row", "reward.on_error=zero", *needles)
    assert line.startswith("error: reward ")
    assert f"warning: reward.file runs the Python code in {reward}" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or read_metrics(tmp_path / "run") == []


MIXED_REWARD = """
import time
calls = 0

def compute_score(prompt, response, sample):
    # call k (0-based) fails by k % 8: 0 raises, 1 NaN, 2 wrong type, 3 hangs (only the first time)
    global calls
    k, calls = calls, calls + 1
    if k % 8 == 0:
        raise KeyError("target")
    if k % 8 == 1:
        return float("nan")
    if k % 8 == 2:
        return [1.0]
    if k == 3:
        while True:
            time.sleep(0.01)
    return {"score": 0.5, "length": float(len(response))}
"""


def test_bad_reward_with_on_error_zero_continues_and_counts_errors(tmp_path):
    reward = write(tmp_path / "mixed.py", MIXED_REWARD)
    # reward.workers=0: in the trainer process, where the call counter is one (in a pool each worker has its
    # own; tests/test_reward_runtime.py covers the pool)
    proc = train(REINFORCE, *FAST, "trainer.total_steps=2", "rollout.n=4", f"reward.file={reward}", "reward.workers=0",
                 "reward.timeout_s=0.3", "reward.on_error=zero", run_dir=tmp_path / "run", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(tmp_path / "run")
    # 16 calls a step: step 1 has 2 raises + 2 NaN + 2 wrong types + the one hang; step 2 the same without the hang
    assert [r["reward/errors"] for r in rows] == [7.0, 6.0]
    assert rows[0]["reward/mean"] == pytest.approx(0.5 * 9 / 16)  # failed calls score 0
    assert "reward/length" in rows[0]


@pytest.mark.parametrize("source, overrides, needles", [
    ("def compute_score(prompt, response, sample)\n    return 0.0\n", [], ["failed to import", "SyntaxError"]),
    ("import nanoverl_no_such_module\n", [], ["failed to import", "nanoverl_no_such_module"]),
    ("def score(prompt, response, sample):\n    return 0.0\n", [], ["reward.function = 'compute_score'"]),
    ("def score(prompt, response, sample):\n    return 0.0\n", ["reward.function=scor"], ["reward.function = 'scor'"]),
], ids=["syntax-error", "import-error", "no-function", "wrong-function-name"])
def test_reward_file_that_cannot_be_used(tmp_path, source, overrides, needles):
    reward = write(tmp_path / "my_reward.py", source)
    proc = run_cli("--config", REINFORCE, f"reward.file={reward}", *overrides, "--dry-run")
    assert_user_error(proc, *needles)


def test_missing_reward_file(tmp_path):
    proc = run_cli("--config", REINFORCE, f"reward.file={tmp_path}/nope.py", "--dry-run")
    assert_user_error(proc, "reward.file", "nope.py' does not exist")


# ---- plugins ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def faults_site(tmp_path_factory) -> Path:
    """tests/fixtures/nanoverl-fixture-faults installed with pip into a private folder."""
    site = tmp_path_factory.mktemp("faults-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(FIXTURES / "nanoverl-fixture-faults")], check=True, capture_output=True)
    return site


@pytest.mark.parametrize("name, needles", [
    ("import_raises", ["reward 'import_raises' from nanoverl-fixture-faults failed to import",
                       "RuntimeError", "NANOVERL_DISABLE_PLUGINS=nanoverl-fixture-faults"]),
    ("missing_dependency", ["reward 'missing_dependency' from nanoverl-fixture-faults cannot be imported",
                            "nanoverl_fixture_package_that_is_not_installed"]),
])
def test_reward_plugin_whose_module_fails_to_import(faults_site, tmp_path, name, needles):
    proc = train(REINFORCE, *FAST, f"reward.name={name}", run_dir=tmp_path / "run", env=cli_env(PYTHONPATH=str(faults_site)))
    assert_user_error(proc, *needles)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_broken_plugin_blocks_a_real_training_run(plugin_site, tmp_path):
    env = cli_env(PYTHONPATH=str(plugin_site / "nanoverl-fixture-broken"))
    proc = train(REINFORCE, *FAST, run_dir=tmp_path / "run", env=env)
    assert_user_error(proc, "plugin nanoverl-fixture-broken failed to import", "ModuleNotFoundError")
    assert not (tmp_path / "run").exists()


# ---- devices ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["banana", "mps", "cuda:x"])
def test_a_device_name_outside_auto_cpu_cuda_is_rejected_before_any_backend_loads(device):
    proc = run_cli("--config", REINFORCE, f"trainer.device={device}", "--dry-run")
    assert_user_error(proc, f"trainer.device = {device!r} is not a supported device", "use auto, cpu, cuda or cuda:N")


NO_CUDA = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")


@NO_CUDA
def test_cuda_asked_for_on_a_machine_without_it(tmp_path):
    """The debug worker (core); cuda:N past the device count is pinned in test_cli.py."""
    assert_user_error(train(REINFORCE, *FAST, "trainer.device=cuda", run_dir=tmp_path / "run"),
                      "trainer.device = 'cuda'", "no such CUDA device", "trainer.device=cpu")


@NO_CUDA
@pytest.mark.hf
def test_hf_worker_asked_for_cuda_on_a_machine_without_it(tmp_path):
    assert_user_error(train(TINY, *FAST, "trainer.device=cuda", run_dir=tmp_path / "run"),
                      "trainer.device = 'cuda'", "no such CUDA device is available")
