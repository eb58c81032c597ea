"""Arriving from verl or TRL: their key names stop with one line naming nanoverl's (one table,
nanoverl_core/foreign_keys.py, whose every target must be a real key), `data.train_files` as one string,
`--checkpoint step_2` finding step_000002, `nanoverl-train` without --config, and an install hint that
works from this checkout.
"""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES, ROOT, assert_user_error, cli_env, first_party_registry, read_metrics, run_cli


def test_every_mapped_nanoverl_key_exists_and_no_foreign_key_is_a_nanoverl_key():
    from nanoverl_core.foreign_keys import FOREIGN_KEYS
    from nanoverl_core.config.load import _field_type

    registry = first_party_registry()
    for key, (whose, target, note) in FOREIGN_KEYS.items():
        assert whose in ("verl", "TRL"), key
        assert _field_type(key.split("."), registry) is None, f"{key} is a nanoverl key; it needs no mapping"
        if target:
            assert _field_type(target.split("."), registry) is not None, f"{key} maps to {target}, not a key"
        else:
            assert note, f"{key} maps to nothing and says nothing"


def test_each_foreign_key_as_an_override_is_one_error_naming_the_nanoverl_key():
    from nanoverl_core.config import config_from_dict
    from nanoverl_core.foreign_keys import FOREIGN_KEYS
    from nanoverl_core.errors import ConfigError

    registry = first_party_registry()
    for key, (whose, target, _) in FOREIGN_KEYS.items():
        with pytest.raises(ConfigError) as err:
            config_from_dict({}, [f"{key}=1"], registry=registry)
        assert f"'{key}' ({whose}'s name)" in str(err.value) and target in str(err.value), str(err.value)


def test_the_docs_page_maps_every_key_of_the_table():
    from nanoverl_core.foreign_keys import FOREIGN_KEYS

    page = (ROOT / "docs" / "from-verl-and-trl.md").read_text()
    missing = [key for key in FOREIGN_KEYS if f"`{key}`" not in page]
    assert not missing, f"docs/from-verl-and-trl.md does not list {missing}"


def test_a_verl_yaml_stops_with_one_line_naming_the_key(tmp_path):
    config = tmp_path / "verl.yaml"
    config.write_text("data:\n  train_files: a.parquet\n  train_batch_size: 16\n")
    proc = run_cli("--config", str(config), "--dry-run")
    assert_user_error(proc, "'data.train_batch_size' (verl's name): use data.batch_size")
    proc = run_cli("--dry-run", "algorithm.kl_ctrl.kl_coef=0.01")
    assert_user_error(proc, "'algorithm.kl_ctrl.kl_coef' (verl's name): use algorithm.kl_coef")
    proc = run_cli("--dry-run", "num_generations=8")
    assert_user_error(proc, "'num_generations' (TRL's name): use rollout.n")


def test_train_files_as_one_string_is_a_one_file_list(tmp_path):
    from nanoverl_core.config import config_from_dict, load_config

    registry = first_party_registry()
    config = config_from_dict({"data": {"train_files": "a.parquet", "val_files": "b.jsonl"}}, registry=registry)
    assert config.data.train_files == ["a.parquet"] and config.data.val_files == ["b.jsonl"]
    assert config_from_dict({}, ["data.train_files=x.jsonl"], registry=registry).data.train_files == ["x.jsonl"]
    toml = tmp_path / "c.toml"
    toml.write_text('[data]\ntrain_files = "t.parquet"\n')
    assert load_config(toml, registry=registry).data.train_files == ["t.parquet"]


def test_a_checkpoint_named_without_padding_finds_the_padded_folder(tmp_path):
    from nanoverl_core.errors import CheckpointError
    from nanoverl_core.trainer.checkpoint import find_checkpoint, find_resume

    root = tmp_path / "run" / "checkpoints"
    for step in (200, 400):
        (root / f"step_{step:06d}").mkdir(parents=True)
        (root / f"step_{step:06d}" / "state.json").write_text("{}")
    assert find_checkpoint(root / "step_400", "--checkpoint") == root / "step_000400"
    assert find_checkpoint(tmp_path / "step_200", "--checkpoint", tmp_path / "run") == root / "step_000200"
    assert find_resume(str(root / "step_200"), root) == root / "step_000200"
    assert (root / "abandoned-step_000400").is_dir()  # resuming an older one sets the newer aside, as before
    with pytest.raises(CheckpointError, match="step_300"):
        find_checkpoint(root / "step_300", "--checkpoint")


def test_nanoverl_train_runs_without_config_and_eval_finds_step_2(tmp_path):
    """The defaults plus overrides train the debug task; `eval --checkpoint step_2` (no padding, no path)
    evaluates that run's step_000002."""
    run_dir = tmp_path / "run"
    data = ROOT / "examples" / "data" / "debug_copy"
    args = [f"data.train_files={data / 'train.jsonl'}", f"data.val_files={data / 'val.jsonl'}",
            "algorithm.advantage_estimator=reinforce_plus_plus", "reward.name=char_match", "data.batch_size=4",
            "rollout.n=2", "rollout.max_new_tokens=4", f"trainer.output_dir={run_dir}", "trainer.progress=none",
            "tracking.trackers=[jsonl]", "reward.workers=0"]
    proc = run_cli(*args, "trainer.total_steps=2", "trainer.save_every=2", "trainer.val_every=0", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(read_metrics(run_dir)) == 2 and (run_dir / "checkpoints" / "step_000002" / "state.json").is_file()
    proc = run_cli("eval", "--checkpoint", "step_2", "--json", *args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["checkpoint"] == str(run_dir / "checkpoints" / "step_000002") and report["prompts"] > 0


def test_a_missing_first_party_plugin_names_the_checkout_install():
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "--dry-run", "worker.name=hf",
                   env=cli_env(NANOVERL_DISABLE_PLUGINS="nanoverl-hf"))
    assert_user_error(proc, 'pip install "nanoverl[hf]"', 'from this checkout: pip install -e "plugins/nanoverl-hf"')
