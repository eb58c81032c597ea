"""The second catalogue of user mistakes, by class (docs/faults.md, "The newer features"): each case runs the
real CLI and exits 2 with exactly one `error:` line naming the key, file, row or variable and the fix, no
traceback and no library log line, and leaves the run directory as it found it (tree and file hashes).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import EXAMPLES, assert_user_error, cli_env, run_cli

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
VAL = "data.val_files=[examples/data/debug_copy/val.jsonl]"
FAST = ["trainer.progress=none", "trainer.total_steps=1", "trainer.save_every=0", "data.val_files=[]",
        "data.batch_size=4", "rollout.n=2", "tracking.trackers=[jsonl]"]
LONG = "a" * 300


def tree(folder: Path) -> dict[str, str]:
    """Every entry under `folder` with its content's hash ("dir" for a folder); {} if it does not exist."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def refused(tmp_path: Path, args: list[str], *needles: str, env=None, run_dir: Path | None = None) -> str:
    """`nanoverl-train ARGS` exits 2 with one line holding every needle; the run directory is unchanged."""
    run_dir = run_dir or tmp_path / "run"
    before = tree(run_dir)
    line = assert_user_error(run_cli(*args, env=env), *needles)
    assert tree(run_dir) == before, "a run that refuses changed its run directory"
    return line


def dry(tmp_path: Path, *overrides: str) -> list[str]:
    return ["--config", REINFORCE, "--dry-run", f"trainer.output_dir={tmp_path / 'run'}", *overrides]


def train(tmp_path: Path, *overrides: str) -> list[str]:
    return ["--config", REINFORCE, *FAST, f"trainer.output_dir={tmp_path / 'run'}", *overrides]


# ---- 1. a value accepted that the component cannot mean ---------------------------------------------
@pytest.mark.parametrize("overrides, needles", [
    (["algorithm.gamma=2"], ["'algorithm.gamma'", "in [0, 1]"]),                                  # a fraction as 2
    (["actor.policy_loss=kl_cov", "actor.kl_cov.ratio=2"], ["'actor.kl_cov.ratio'", "in (0, 1]"]),
    (["actor.policy_loss=clip_cov", "actor.clip_cov.lower_bound=9"],                              # low above high
     ["'actor.clip_cov.upper_bound'", "below lower_bound = 9.0"]),
    (["algorithm.rollout_correction.rs_level=token", "algorithm.rollout_correction.rs_threshold_low=3",
      "rollout.debug.log_probs=true"], ["rs_threshold_low", "above rs_threshold_high"]),
    (["trainer.total_epochs=1", "trainer.total_steps=null", "data.batch_size=1024"],             # zero steps
     ["data.batch_size = 1024", "only 512 prompts", "lower data.batch_size"]),
    (["data.batch_size=1024"], ["data.batch_size = 1024", "only 512 prompts"]),
    (["trainer.resume=autp"], ["trainer.resume = 'autp'", "did you mean 'auto'?"]),
    (["algorithm.rollout_correction.is_level=token"],                                             # no log-probs
     ["algorithm.rollout_correction.is_level = 'token'", "[rollout.debug] log_probs = true"]),
    (["trainer.critic_warmup=3"], ["trainer.critic_warmup = 3", "critic.enable = false"]),
    (["critic.enable=true", "algorithm.advantage_estimator=gae", "trainer.critic_warmup=200",
      "trainer.total_steps=100"], ["trainer.critic_warmup = 200", "never update"]),
], ids=["fraction-2", "component-fraction", "low-above-high", "rs-low-above-high", "epochs-zero-steps",
        "batch-over-rows", "resume-typo", "correction-without-log-probs", "critic-warmup-without-critic",
        "critic-warmup-whole-run"])
def test_a_value_the_component_cannot_mean_is_refused_by_the_dry_run(tmp_path, overrides, needles):
    refused(tmp_path, dry(tmp_path, *overrides), *needles)


def test_the_run_refuses_what_the_dry_run_refuses_before_writing(tmp_path):
    refused(tmp_path, train(tmp_path, "trainer.resume=nevr"), "trainer.resume = 'nevr'", "did you mean 'never'?")
    refused(tmp_path, train(tmp_path, "algorithm.rollout_correction.rs_level=sequence"),
            "algorithm.rollout_correction.rs_level = 'sequence'")


# ---- 2. a shape the model cannot take ---------------------------------------------------------------
@pytest.mark.parametrize("overrides, needles", [
    (["worker.debug.hidden_size=66"], ["'worker.debug.hidden_size'", "a multiple of 4"]),
    (["worker.debug.vocab_size=5"], ["'worker.debug.vocab_size'", "22 tokens"]),
], ids=["hidden-not-divisible-by-heads", "vocab-below-tokenizer"])
def test_a_model_shape_is_checked_at_its_settings(tmp_path, overrides, needles):
    refused(tmp_path, dry(tmp_path, *overrides), *needles)
    refused(tmp_path, train(tmp_path, *overrides), *needles)        # once a traceback at step 1, a half-made run


def test_a_model_the_worker_cannot_build_names_the_keys(tmp_path):
    """The model-build boundary: what the model's own code raises (ValueError, RuntimeError) is one line."""
    from nanoverl_core.config import load_config
    from nanoverl_core.errors import ConfigError
    from nanoverl_core.trainer.resolve import build_workers

    def refuses(config):
        raise ValueError("hidden_size 66 is not a multiple of the number of attention heads 4")

    config = load_config(REINFORCE)
    with pytest.raises(ConfigError, match=r"worker.name = 'debug' cannot build the model .*\[worker.debug\]"):
        build_workers({"worker": refuses}, config)


# ---- 3. a path the operating system refuses ----------------------------------------------------------
def test_paths_a_command_writes_are_checked_before_the_work(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    refused(tmp_path, dry(tmp_path, f"trainer.output_dir={tmp_path / LONG}"), "'trainer.output_dir'", "over the 255")
    refused(tmp_path, dry(tmp_path, f"trainer.output_dir={tmp_path / 'file' / 'run'}"),
            "'trainer.output_dir'", "file is a file, not a folder")
    ev = ["eval", "--config", REINFORCE, VAL, "--samples"]
    refused(tmp_path, [*ev, str(tmp_path / "folder")], "--samples", "is a folder, not a file")
    refused(tmp_path, [*ev, str(tmp_path / "file" / "s.jsonl")], "--samples", "is a file, not a folder")
    refused(tmp_path, [*ev, str(tmp_path / f"{LONG}.jsonl")], "--samples", "over the 255")
    for out, needle in ((tmp_path / "file", "it is a file, not a folder"),
                        (tmp_path / "file" / "out", "is a file, not a folder"), (tmp_path / LONG, "over the 255")):
        refused(tmp_path, ["export", str(tmp_path / "no-run"), str(out)], "OUT_DIR", needle)
    assert not any((tmp_path / "folder").iterdir())


# ---- 4. a rerun that rewrites what it should protect ----------------------------------------------
def test_a_rerun_with_a_changed_config_keeps_the_run_directory_and_names_the_keys(tmp_path):
    first = run_cli(*train(tmp_path))
    assert first.returncode == 0, first.stderr[-2000:]
    line = refused(tmp_path, train(tmp_path, "trainer.total_steps=2", "worker.debug.hidden_size=32"),
                   "cannot be loaded", "config.json (kept as it was) differs", "worker.debug.hidden_size",
                   "new trainer.output_dir")
    assert "trainer.total_steps" not in line.split("differs")[1]         # the run length may change on resume


# ---- 5. files that are not what their names say ------------------------------------------------------
@pytest.mark.parametrize("name, content, needles", [
    ("text.parquet", b"prompt,answer\n12=,12\n", ["text.parquet is not a parquet file"]),
    ("nul.jsonl", b'{"prompt": "12=", "target": "12"}\n{"prompt": "1\x002=", "target": "12"}\n',
     ["nul.jsonl cannot be read: line 2 holds a NUL byte"]),
    ("latin1.jsonl", '{"prompt": "12=", "target": "caf\u00e9"}\n'.encode("latin-1"),
     ["latin1.jsonl cannot be read: line 1 is not UTF-8", "0xe9"]),
    ("array.jsonl", b'[1, 2]\n', ["array.jsonl cannot be read: line 1 holds a list, not a JSON object"]),
], ids=["text-as-parquet", "nul-byte", "latin-1", "not-an-object"])
def test_a_data_file_that_is_not_what_its_name_says_names_file_and_line(tmp_path, name, content, needles):
    data = tmp_path / name
    data.write_bytes(content)
    refused(tmp_path, dry(tmp_path, f"data.train_files=[{data}]"), "data.train_files", *needles)
    refused(tmp_path, train(tmp_path, f"data.train_files=[{data}]"), "data.train_files", *needles)


def test_a_config_file_in_latin_1_names_the_file_and_line(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes('[trainer]\nseed = 1\n# caf\u00e9\n'.encode("latin-1"))
    refused(tmp_path, ["--config", str(cfg), "--dry-run"], str(cfg), "line 3 is not UTF-8", "save the file as UTF-8")


def test_a_validation_file_that_cannot_be_read_names_its_key(tmp_path):
    data = tmp_path / "val.jsonl"
    data.write_bytes(b'{"prompt": "1\xff"}\n')
    refused(tmp_path, train(tmp_path, f"data.val_files=[{data}]"), "data.val_files", "val.jsonl", "not UTF-8")
    refused(tmp_path, dry(tmp_path, f"data.val_files=[{data}]"), "data.val_files", "val.jsonl", "not UTF-8")


def test_a_dry_run_reads_the_validation_rows_the_run_needs(tmp_path):
    """The run reads the validation rows before its first step, so the dry-run does: a name the OS refuses,
    and trainer.eval_before_after with no validation rows, are refused by both."""
    too_long = f"data.val_files=[{tmp_path / ('y' * 300)}.jsonl]"
    for args in (dry(tmp_path, too_long), train(tmp_path, too_long)):
        refused(tmp_path, args, "data.val_files", "cannot be opened", "fix the path")
    for args in (dry(tmp_path, "data.val_files=[]", "trainer.eval_before_after=true"),
                 train(tmp_path, "trainer.eval_before_after=true")):
        refused(tmp_path, args, "trainer.eval_before_after = true", "data.val_files", "eval_before_after = false")


# ---- 6. errors from inside a library ----------------------------------------------------------------
def test_an_integer_past_pythons_limit_names_the_key_or_file(tmp_path):
    huge = "1" * 100_000
    refused(tmp_path, dry(tmp_path, f"trainer.seed={huge}"), "override trainer.seed", "100000 digits")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[trainer]\nseed = {huge}\n")
    refused(tmp_path, ["--config", str(cfg), "--dry-run"], str(cfg), "100000 digits")


def test_a_chat_template_that_raises_names_file_and_row(tmp_path):
    """jinja's raise_exception (a template refusing a system message, say) at the data boundary."""
    from nanoverl_core.config import DataConfig
    from nanoverl_core.data import render_prompt
    from nanoverl_core.errors import DataError

    class Refusing:
        chat_template = "{{ raise_exception('System role not supported') }}"

        def apply_chat_template(self, messages, **kwargs):
            import jinja2
            raise jinja2.exceptions.TemplateError("System role not supported")

    row = {"__file__": "chats.jsonl", "__row__": 3, "prompt": [{"role": "system", "content": "x"}]}
    with pytest.raises(DataError, match=r"chats.jsonl row 3: the tokenizer's chat template refuses .*System role "
                                        r"not supported.*data.apply_chat_template = false"):
        render_prompt(row, DataConfig(), Refusing())


# ---- 7. the command line ----------------------------------------------------------------------------
def test_the_command_line_mistakes(tmp_path):
    refused(tmp_path, ["--config", REINFORCE, "--config", REINFORCE, "--dry-run"], "--config is given twice")
    refused(tmp_path, ["evl", "--config", REINFORCE], "unknown command 'evl'", "did you mean `nanoverl-train eval`?")
    refused(tmp_path, ["examples/configs/debug_reinforce.toml"], "goes after --config")
    refused(tmp_path, ["eval", "--config", REINFORCE, "--samples", str(tmp_path / "a.jsonl"), "--samples",
                       str(tmp_path / "b.jsonl"), VAL], "--samples is given twice")


def test_flags_and_overrides_mix_in_any_order_for_every_sub_command(tmp_path):
    proc = run_cli("--dry-run", "data.batch_size=4", "--config", REINFORCE, "rollout.n=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["config"]["data"]["batch_size"] == 4
    proc = run_cli("eval", "data.val_max_samples=2", "--config", REINFORCE, VAL, "--json", "rollout.val_n=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["prompts"] == 2


# ---- 8. the plugin variables -------------------------------------------------------------------------
def test_the_plugin_variables_name_the_wrong_entry(tmp_path):
    refused(tmp_path, dry(tmp_path), "NANOVERL_LOAD_PLUGINS names 'nanoverl-nope'", "no installed plugin",
            env=cli_env(NANOVERL_LOAD_PLUGINS="nanoverl-nope"))
    proc = run_cli(*dry(tmp_path), env=cli_env(NANOVERL_DISABLE_PLUGINS="nanoverl-nope"))
    assert proc.returncode == 0 and "warning: NANOVERL_DISABLE_PLUGINS names 'nanoverl-nope'" in proc.stderr


def test_a_name_the_plugin_variables_leave_out_says_so_instead_of_pip_install(tmp_path):
    from nanoverl_core.errors import PluginError
    from nanoverl_core.plugins import load_registry

    registry = load_registry()
    registry.excluded = {"nanoverl-hf": "NANOVERL_DISABLE_PLUGINS"}
    registry.entries["worker"].pop("hf", None)
    with pytest.raises(PluginError, match=r"nanoverl-hf, which is installed but left out by NANOVERL_DISABLE_PLUGINS"
                                          r".*remove it from NANOVERL_DISABLE_PLUGINS") as info:
        registry.entry("worker", "hf", "worker.name")
    assert str(info.value).endswith("remove it from NANOVERL_DISABLE_PLUGINS")        # the fix that applies, last
