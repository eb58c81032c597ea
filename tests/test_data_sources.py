"""Data sources (`register_data_sources`, `data.source`) and trainer.total_epochs.

The generator is `tests/fixtures/nanoverl-fixture-gen` (copy-task rows drawn from (split, seed, epoch)),
installed with pip; in-process tests import its source from that install, CLI tests run it as a user would.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import EXAMPLES, ROOT, assert_identical_runs, assert_user_error, read_metrics, run_cli, with_plugins
from nanoverl_core.builtins.debug import CharTokenizer
from nanoverl_core.config import DataConfig
from nanoverl_core.data import PromptLoader, load_split
from nanoverl_core.errors import DataError

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
QUIET = "trainer.progress=none"
GEN = ["data.source=copy_gen", "data.train_files=[]", "data.val_files=[]"]


@pytest.fixture
def copy_gen(plugin_site, monkeypatch):
    """The fixture's source module, imported from its pip install."""
    monkeypatch.syspath_prepend(str(plugin_site / "nanoverl-fixture-gen"))
    from nanoverl_fixture_gen import settings, source
    return source, settings


def _loader(source_mod, settings_mod, **kw):
    gen = source_mod.CopyGenerator(settings_mod.CopyGenSettings(**kw))
    cfg = DataConfig(source="copy_gen", batch_size=8)
    val = load_split(gen, "val", cfg, CharTokenizer())
    return gen, val, PromptLoader(gen, cfg, CharTokenizer(), seed=0, exclude=frozenset(val.texts))


def test_a_generated_source_draws_fresh_rows_every_epoch_and_never_a_validation_prompt(copy_gen, capsys):
    """Two-digit strings: 100 of them, so 40 validation prompts collide with many of 64 training rows."""
    gen, val, loader = _loader(*copy_gen, digits=2, size=64, val_size=40)
    val_prompts = {r["prompt"] for r in gen.rows("val", 0)}
    for epoch in (0, 1, 2):
        expected = [r["prompt"] for r in gen.rows("train", epoch) if r["prompt"] not in val_prompts]
        assert [r["prompt"] for r in loader.dataset(epoch).rows] == expected
        assert 0 < len(expected) < 64                                     # some were dropped, some kept
    assert "prompts that are validation prompts" in capsys.readouterr().err
    assert [r["prompt"] for r in gen.rows("train", 0)] != [r["prompt"] for r in gen.rows("train", 1)]
    assert loader.steps_per_epoch == len([r for r in gen.rows("train", 0) if r["prompt"] not in val_prompts]) // 8

    # the sampler walks epoch 0's rows, then epoch 1's; every batch holds prompts of its own epoch
    seen = []
    while loader.sampler.epoch < 2:
        batch = loader.next_batch(pad_token_id=0)
        seen.append((loader.sampler.epoch, [r["prompt"] for r in batch["row"]]))
    for epoch, prompts in seen:
        epoch_prompts = {r["prompt"] for r in loader.dataset(epoch).rows}
        assert set(prompts) <= epoch_prompts and not set(prompts) & val_prompts


def test_a_resumed_loader_regenerates_its_epoch_and_continues_at_the_same_row(copy_gen):
    _, _, first = _loader(*copy_gen, size=20)
    for _ in range(3):                                                     # 2 batches an epoch: into epoch 1
        first.next_batch(0)
    state = first.sampler.state_dict()
    assert state == {"epoch": 1, "position": 8}
    _, _, resumed = _loader(*copy_gen, size=20)
    resumed.sampler.load_state_dict(state)
    for _ in range(3):                                                     # across the next epoch boundary
        assert resumed.next_batch(0)["row"] == first.next_batch(0)["row"]


def test_val_max_samples_keeps_the_first_validation_rows_and_training_skips_only_those(copy_gen):
    source_mod, settings_mod = copy_gen
    gen = source_mod.CopyGenerator(settings_mod.CopyGenSettings(digits=2, size=64, val_size=40))
    every = [r["prompt"] for r in gen.rows("val", 0)]
    cfg = DataConfig(source="copy_gen", batch_size=8, val_max_samples=5)
    val = load_split(gen, "val", cfg, CharTokenizer())
    assert [r["prompt"] for r in val.rows] == every[:5]
    loader = PromptLoader(gen, cfg, CharTokenizer(), seed=0, exclude=frozenset(val.texts))
    trained = {r["prompt"] for r in loader.dataset(0).rows}
    assert not trained & set(every[:5]) and trained & set(every[5:])     # the 35 not validated on may be trained
    assert len(load_split(gen, "val", DataConfig(source="copy_gen", val_max_samples=1000), CharTokenizer())) == 40


class _RecordingSource:
    """A generated source of 16 copy rows an epoch that records which thread drew each epoch."""
    generated = True

    def __init__(self, fail_epoch: int | None = None):
        self.calls, self.fail_epoch = [], fail_epoch

    def rows(self, split, epoch):
        self.calls.append((split, epoch, threading.current_thread() is threading.main_thread()))
        if epoch == self.fail_epoch:
            raise DataError(f"epoch {epoch} cannot be drawn")
        rng = random.Random(f"{split}-{epoch}")
        return [{"prompt": f"{rng.randrange(1000):03d}="} for _ in range(16)] if split == "train" else []


def _drawn(source, call, timeout=10.0):
    deadline = time.monotonic() + timeout
    while call not in source.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    return call in source.calls


def test_the_next_epoch_is_drawn_in_the_background_while_this_one_trains():
    source = _RecordingSource()
    loader = PromptLoader(source, DataConfig(source="rec", batch_size=8, shuffle=False), CharTokenizer(), seed=0)
    assert source.calls[0] == ("train", 0, True)
    assert _drawn(source, ("train", 1, False))                       # prefetched before epoch 1 is asked for
    batches = [[r["prompt"] for r in loader.next_batch(0)["row"]] for _ in range(4)]
    assert ("train", 1, True) not in source.calls                    # the trainer's thread never drew epoch 1
    assert batches[2] + batches[3] == [r["prompt"] for r in source.rows("train", 1)]
    assert _drawn(source, ("train", 2, False))


def test_an_epoch_that_cannot_be_drawn_fails_when_the_run_reaches_it_with_the_sources_error():
    source = _RecordingSource(fail_epoch=1)
    loader = PromptLoader(source, DataConfig(source="rec", batch_size=8), CharTokenizer(), seed=0)
    assert _drawn(source, ("train", 1, False))                       # the background draw failed ...
    loader.next_batch(0), loader.next_batch(0)                       # ... and epoch 0 trains all the same
    with pytest.raises(DataError, match="epoch 1 cannot be drawn"):
        loader.next_batch(0)


def test_files_is_the_registered_default_source_and_reads_the_same_rows_every_epoch(tmp_path):
    proc = run_cli("--config", REINFORCE, "--dry-run", f"trainer.output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["config"]["data"]["source"] == "files"
    assert {"kind": "data_source", "name": "files", "provider": "nanoverl"} in out["plugins"]


# ---- trainer.total_epochs -----------------------------------------------------------------------
def test_total_epochs_counts_steps_from_the_loaded_rows_and_ends_on_the_epoch_boundary(tmp_path):
    """512 copy prompts in batches of 128: 4 steps an epoch, 2 epochs = 8 steps; the dry run says so,
    the run takes exactly 8 and ends at the last row of epoch 1."""
    args = ["--config", REINFORCE, QUIET, "trainer.total_epochs=2", "data.batch_size=128", "rollout.n=2",
            "trainer.val_every=0", "trainer.save_every=4", "tracking.trackers=[jsonl]", f"trainer.output_dir={tmp_path}"]
    dry = run_cli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["schedule"] == {"total_epochs": 2, "train_rows": 512, "steps_per_epoch": 4,
                                                  "total_steps": 8}
    assert "ignoring trainer.total_steps = 150" in dry.stderr              # the file's count gives way
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 9))
    states = {p.name: json.loads((p / "state.json").read_text())["sampler"]
              for p in sorted((tmp_path / "checkpoints").iterdir())}
    assert states == {"step_000004": {"epoch": 0, "position": 512}, "step_000008": {"epoch": 1, "position": 512}}


def test_total_epochs_and_total_steps_together_is_one_line_naming_both(tmp_path):
    config = tmp_path / "both.toml"
    config.write_text((ROOT / "examples/configs/debug_reinforce.toml").read_text().replace(
        "total_steps = 150", "total_steps = 150\ntotal_epochs = 2"))
    assert_user_error(run_cli("--config", str(config), "--dry-run"),
                      "trainer.total_epochs = 2 and trainer.total_steps = 150 are both set")
    assert_user_error(run_cli("--config", REINFORCE, "--dry-run", "trainer.total_epochs=-1"),
                      "'trainer.total_epochs': -1 is not an integer >= 0")


# ---- a generator through the command line ----------------------------------------------------------
def test_a_generated_source_trains_epochs_of_fresh_rows_without_a_validation_prompt(plugin_site, tmp_path):
    env = with_plugins(plugin_site, "nanoverl-fixture-gen")
    args = ["--config", REINFORCE, QUIET, *GEN, "data.copy_gen.size=32", "data.copy_gen.val_size=24",
            "data.copy_gen.digits=2", "data.batch_size=8", "rollout.n=2", "trainer.total_epochs=3",
            "trainer.val_every=4", "trainer.rollout_samples=-1", "tracking.trackers=[jsonl]",
            f"trainer.output_dir={tmp_path}"]
    sys.path.insert(0, str(plugin_site / "nanoverl-fixture-gen"))
    try:
        from nanoverl_fixture_gen.settings import CopyGenSettings
        from nanoverl_fixture_gen.source import CopyGenerator
    finally:
        sys.path.pop(0)
    gen = CopyGenerator(CopyGenSettings(size=32, val_size=24, digits=2))
    val = {r["prompt"] for r in gen.rows("val", 0)}
    epochs = [[r["prompt"] for r in gen.rows("train", e) if r["prompt"] not in val] for e in range(6)]
    per_epoch = len(epochs[0]) // 8                                       # steps = 3 epochs of epoch 0's size
    epoch_of_step = [e for e, rows in enumerate(epochs) for _ in range(len(rows) // 8)]  # later epochs may differ
    proc = run_cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 3 * per_epoch + 1))
    assert "val/reward/mean" in rows[3]
    for step in range(1, 3 * per_epoch + 1):
        prompts = {json.loads(x)["prompt"] for x in (tmp_path / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()}
        assert not prompts & val and prompts <= set(epochs[epoch_of_step[step - 1]]), (step, prompts)
    assert len({epoch_of_step[s] for s in range(3 * per_epoch)}) >= 3      # three epochs of fresh rows


KILL_DRIVER = '''
"""nanoverl-train that SIGKILLs itself in the middle of step 6 (after the checkpoint of step 4)."""
import os, signal, sys
from nanoverl_core.cli import main
from nanoverl_core.trainer.trainer import Trainer

generate = Trainer.generate


def killing(self, batch, gen_round=0):
    if self.step == 6:
        os.kill(os.getpid(), signal.SIGKILL)
    return generate(self, batch, gen_round)


Trainer.generate = killing
sys.exit(main(sys.argv[1:]))
'''


def test_a_run_on_a_generated_source_killed_mid_step_resumes_to_the_identical_run(plugin_site, tmp_path):
    """20 rows an epoch in batches of 8 (2 steps an epoch), so the run crosses 4 epochs of fresh rows;
    SIGKILLed in step 6, resumed from step 4's checkpoint: the same metrics and final weights."""
    env = with_plugins(plugin_site, "nanoverl-fixture-gen")
    args = ["--config", REINFORCE, QUIET, *GEN, "data.copy_gen.size=20", "data.batch_size=8", "rollout.n=4",
            "trainer.total_steps=8", "trainer.save_every=2", "trainer.val_every=3", "tracking.trackers=[jsonl]"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    proc = run_cli(*args, f"trainer.output_dir={reference}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    proc = subprocess.run([sys.executable, str(driver), *args, f"trainer.output_dir={run_dir}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert len(read_metrics(run_dir)) == 5
    resumed = run_cli(*args, f"trainer.output_dir={run_dir}", env=env)
    assert resumed.returncode == 0 and "(step 4)" in resumed.stderr, resumed.stderr[-3000:]

    assert_identical_runs(reference, run_dir, "step_000008")


def test_bad_generator_settings_exit_2_before_anything_is_written(plugin_site, tmp_path):
    env = with_plugins(plugin_site, "nanoverl-fixture-gen")
    common = ["--config", REINFORCE, f"trainer.output_dir={tmp_path / 'run'}"]
    assert_user_error(run_cli(*common, *GEN, "data.copy_gen.forbidden=x", env=env),
                      "data.copy_gen.forbidden = 'x' must be one digit")
    assert_user_error(run_cli(*common, *GEN, "data.copy_gen.digit=2", "--dry-run", env=env),
                      "data.copy_gen.digit", "did you mean 'data.copy_gen.digits'")
    assert_user_error(run_cli(*common, *GEN, "data.copy_gen.digits=9", "--dry-run", env=env), "data.copy_gen.digits")
    assert_user_error(run_cli(*common, "data.source=copy_gen", "--dry-run", env=env),
                      "data.train_files is set but data.source = 'copy_gen'")
    assert_user_error(run_cli(*common, *GEN[1:], "data.source=copy_ge", "--dry-run", env=env),
                      "data.source = 'copy_ge'", "did you mean 'copy_gen'")
    assert_user_error(run_cli(*common, *GEN, "data.copy_gen.val_size=0", "trainer.eval_before_after=true", env=env),
                      "trainer.eval_before_after = true evaluates on the validation rows",
                      "data.source = 'copy_gen' gives none")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_eval_scores_a_generated_sources_validation_rows(plugin_site, tmp_path):
    env = with_plugins(plugin_site, "nanoverl-fixture-gen")
    proc = run_cli("eval", "--config", REINFORCE, "--json", *GEN, "data.copy_gen.val_size=24",
                   f"trainer.output_dir={tmp_path}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["prompts"] == 24 and "copy_gen/reward/mean" in report["results"]["greedy"]
    assert_user_error(run_cli("eval", "--config", REINFORCE, *GEN, "data.copy_gen.val_size=0", env=env),
                      "data.source = 'copy_gen' gives no validation rows")
