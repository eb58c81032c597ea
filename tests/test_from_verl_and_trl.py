"""Arriving from verl or TRL: their key names stop with one line naming nanoverl's (one table,
nanoverl_core/foreign_keys.py, whose every target must be a real key), every one of a command's in that
one line with its value translated, `nanoverl-train translate` for a whole verl command or TRL
GRPOConfig, suggestions only between related names, `data.train_files` as one string, `--checkpoint
step_2` finding step_000002, `nanoverl-train` without --config, and an install hint that works from this
checkout.
"""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES, ROOT, assert_user_error, cli_env, first_party_registry, read_metrics, run_cli


def test_every_mapped_nanoverl_key_exists_and_no_foreign_key_is_a_nanoverl_key():
    from nanoverl_core.foreign_keys import FOREIGN_KEYS
    from nanoverl_core.config.load import _field_type

    registry = first_party_registry()
    for key, (whose, target, note, _) in FOREIGN_KEYS.items():
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
    for key, (whose, target, _, _) in FOREIGN_KEYS.items():
        with pytest.raises(ConfigError) as err:
            config_from_dict({}, [f"{key}=1"], registry=registry)
        assert f"'{key}' ({whose}'s name)" in str(err.value) and target in str(err.value), str(err.value)


def test_the_docs_page_maps_every_key_of_the_table():
    from nanoverl_core.foreign_keys import FOREIGN_KEYS

    page = (ROOT / "docs" / "from-verl-and-trl.md").read_text()
    missing = [key for key in FOREIGN_KEYS if f"`{key}`" not in page]
    assert not missing, f"docs/from-verl-and-trl.md does not list {missing}"


def test_the_docs_tables_give_each_key_the_tables_nanoverl_key():
    """One table of truth: the page's verl and TRL rows name the nanoverl key FOREIGN_KEYS names (— for none)."""
    import re

    from nanoverl_core.foreign_keys import FOREIGN_KEYS

    page = (ROOT / "docs" / "from-verl-and-trl.md").read_text()
    rows = dict(re.findall(r"^\| `([\w.]+)` \| (`[\w.]+`|—) \|", page, re.M))
    assert set(FOREIGN_KEYS) <= set(rows)
    for key, entry in FOREIGN_KEYS.items():
        assert rows[key] == (f"`{entry.key}`" if entry.key else "—"), key


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


VERL_COMMAND = """python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=gae \\
    data.train_files={data}/train.jsonl data.val_files={data}/val.jsonl \\
    data.train_batch_size=8 \\
    data.max_response_length=4 \\
    actor_rollout_ref.actor.optim.lr=1e-3 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \\
    actor_rollout_ref.actor.clip_ratio=0.25 \\
    actor_rollout_ref.rollout.n=2 \\
    actor_rollout_ref.rollout.top_k=-1 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    critic.optim.lr=1e-4 \\
    trainer.logger=['console'] \\
    trainer.val_before_train=False \\
    trainer.n_gpus_per_node=1 \\
    trainer.total_training_steps=3 $@
"""


def test_a_verl_command_names_every_foreign_key_in_one_error_with_its_translated_value():
    """Before, each run named one foreign key (not the first); now one line names all of them, each with
    nanoverl's setting and value (gae needs a critic: critic.enable=true; verl's top_k -1 is 0), the ones
    nanoverl has no key for, and the other keys it does not know either."""
    from nanoverl_core.translate import parse_foreign

    _, values = parse_foreign(VERL_COMMAND.format(data=ROOT / "examples" / "data" / "debug_copy"))
    words = [f"{k}={v}" for k, v in values.items() if not str(k).startswith("data.") or "files" not in k]
    proc = run_cli("--dry-run", *words, "data.shuffle_seed=3")
    line = assert_user_error(proc, "13 keys are verl's or TRL's",
                             "'algorithm.adv_estimator' (verl's name): use algorithm.advantage_estimator=gae "
                             "critic.enable=true",
                             "'data.train_batch_size' (verl's name): use data.batch_size=8",
                             "'actor_rollout_ref.actor.clip_ratio' (verl's name): use actor.clip_ratio_low=0.25 "
                             "actor.clip_ratio_high=0.25",
                             "'actor_rollout_ref.rollout.top_k' (verl's name): use rollout.top_k=0",
                             "'actor_rollout_ref.actor.fsdp_config.param_offload' (a verl key): nanoverl has no key",
                             "'trainer.n_gpus_per_node' (verl's name): launch with torchrun",
                             "not nanoverl keys either: data.shuffle_seed", "nanoverl-train translate")
    assert "trainer.val_before_train" not in line       # a key of the same name in nanoverl


def test_translate_rewrites_a_verl_command_that_then_runs(tmp_path):
    """`nanoverl-train translate FILE` prints overrides (and --toml a config) for a verl command line, with
    what it could not map as comments; the overrides, plus the backend, pass nanoverl's --dry-run."""
    command = tmp_path / "run_verl.sh"
    command.write_text(VERL_COMMAND.format(data=ROOT / "examples" / "data" / "debug_copy"))
    proc = run_cli("translate", str(command))
    assert proc.returncode == 0, proc.stderr
    overrides = [line.strip().removesuffix(" \\").strip() for line in proc.stdout.splitlines()
                 if line.startswith("    ")]
    assert "algorithm.advantage_estimator=gae" in overrides and "critic.enable=true" in overrides
    assert "rollout.top_k=0" in overrides and "tracking.trackers=[console]" in overrides
    assert "# not mapped: trainer.n_gpus_per_node=1: launch with torchrun" in proc.stdout
    assert "# not mapped: actor_rollout_ref.actor.fsdp_config.param_offload=false" in proc.stdout
    debug = ["worker.name=debug", "rollout.name=debug", f"trainer.output_dir={tmp_path / 'run'}"]
    dry = run_cli("--dry-run", *overrides, *debug)
    assert dry.returncode == 0, dry.stderr[-2000:]
    config = json.loads(dry.stdout)["config"]
    assert (config["data"]["batch_size"], config["actor"]["lr"], config["rollout"]["top_k"]) == (8, 1e-3, 0)
    assert config["critic"]["enable"] and config["critic"]["lr"] == 1e-4 and config["trainer"]["total_steps"] == 3

    toml = run_cli("translate", "--toml", str(command))
    assert toml.returncode == 0, toml.stderr
    (tmp_path / "c.toml").write_text(toml.stdout)
    dry = run_cli("--config", str(tmp_path / "c.toml"), "--dry-run", *debug)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert json.loads(dry.stdout)["config"]["critic"]["enable"] is True


TRL_SCRIPT = """
from trl import GRPOConfig, GRPOTrainer

args = GRPOConfig(
    output_dir="runs/qwen-grpo",
    learning_rate=1e-6,
    loss_type="dr_grpo",
    beta=0.04,
    per_device_train_batch_size=16,
    gradient_accumulation_steps=4,
    num_generations=8,
    max_completion_length=256,
    use_vllm=True,
    logging_steps=10,
)
trainer = GRPOTrainer(model="Qwen/Qwen2-0.5B-Instruct", reward_funcs=reward_len, args=args)
"""


def test_translate_reads_a_trl_grpoconfig_with_loss_type_values_and_batch_sizes(tmp_path):
    script = tmp_path / "train_grpo.py"
    script.write_text(TRL_SCRIPT)
    proc = run_cli("translate", str(script))
    assert proc.returncode == 0, proc.stderr
    for override in ["actor.lr=1e-6", "actor.policy_loss=vanilla", "actor.loss_agg_mode=seq-mean-token-sum-norm",
                     "actor.clip_ratio_c=1e9", "reference.enable=true", "actor.use_kl_loss=true",
                     "actor.kl_loss_coef=0.04", "actor.kl_loss_type=k3", "data.batch_size=8",
                     "actor.mini_batch_size=8", "actor.micro_batch_size=16", "rollout.n=8",
                     "rollout.max_new_tokens=256", "rollout.name=vllm", "trainer.output_dir=runs/qwen-grpo",
                     "algorithm.advantage_estimator=grpo", "algorithm.grpo.epsilon=0.0001"]:
        assert f"    {override}" in proc.stdout, (override, proc.stdout)
    assert "TRL's defaults assumed: scale_rewards=group" in proc.stdout
    assert "# not mapped: logging_steps=10: nanoverl has no key for it" in proc.stdout


def test_foreign_values_get_their_meaning_not_a_look_alike_name():
    """TRL's loss_type dr_grpo as actor.policy_loss suggested 'dro' (an unrelated loss), and PPO as an
    estimator 'opo'; now each names the nanoverl settings it means. A typo still gets the close name."""
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "--dry-run", "actor.policy_loss=dr_grpo")
    line = assert_user_error(proc, "'dr_grpo' is TRL's loss_type", "actor.policy_loss=vanilla",
                             "actor.loss_agg_mode=seq-mean-token-sum-norm")
    assert "'dro'" not in line
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "--dry-run", "algorithm.advantage_estimator=ppo")
    line = assert_user_error(proc, "algorithm.advantage_estimator=gae critic.enable=true")
    assert "'opo'" not in line
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "--dry-run", "actor.policy_loss=vanila")
    assert_user_error(proc, "did you mean 'vanilla'?")
