"""The plugin system through real entry points: listing, lazy loading, conflicts, broken plugins."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import EXAMPLES, ROOT, assert_user_error, cli_env, run_cli, with_plugins
from nanoverl_core.errors import PluginError
from nanoverl_core.plugins import Registry, load_registry

DEBUG = str(EXAMPLES / "debug_reinforce.toml")


def plugins_json(env) -> dict[str, dict]:
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return {p["dist"]: p for p in json.loads(proc.stdout)}


def test_core_builtins_are_listed_with_their_names():
    info = plugins_json(cli_env(NANOVERL_LOAD_PLUGINS=""))
    assert list(info) == ["nanoverl"]
    names = info["nanoverl"]["names"]
    assert names["worker"] == ["debug"] and names["rollout"] == ["debug"]
    assert {"gae", "reinforce_plus_plus"} <= set(names["advantage_estimator"])
    assert {"console", "jsonl", "plot"} <= set(names["tracker"]) and "mlflow" not in names["tracker"]


def test_outside_plugin_installed_with_pip_is_listed(plugin_site):
    info = plugins_json(with_plugins(plugin_site, "nanoverl-fixture"))
    fixture = info["nanoverl-fixture"]
    assert fixture["version"] == "1.2.3"
    assert fixture["names"] == {"advantage_estimator": ["sign"], "reward": ["length_penalty"]}
    assert fixture["hooks"] == ["register_advantage_estimators", "register_rewards"]
    assert fixture["error"] == ""


def test_listing_imports_neither_torch_nor_the_plugins_implementation(plugin_site):
    code = ("import sys; from nanoverl_core.cli import main; main(['plugins']); "
            "bad = [m for m in ('torch', 'torch.distributed', 'transformers', 'vllm', 'nanoverl_fixture.impl') "
            "if m in sys.modules]; print('IMPORTED', bad)")
    proc = subprocess.run([sys.executable, "-c", code], env=with_plugins(plugin_site, "nanoverl-fixture"),
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "IMPORTED []" in proc.stdout


def test_outside_plugin_names_train_end_to_end(plugin_site, tmp_path):
    proc = run_cli("--config", DEBUG, "reward.name=length_penalty", "algorithm.advantage_estimator=sign",
                   "trainer.total_steps=2", "trainer.val_every=0", f"trainer.output_dir={tmp_path}",
                   env=with_plugins(plugin_site, "nanoverl-fixture"))
    assert proc.returncode == 0, proc.stderr
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/length" in last  # extra keys of a dict reward are logged as reward/<key>
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["plugins"]["nanoverl-fixture"] == "1.2.3"


def test_two_plugins_claiming_one_name_is_an_error_naming_both(plugin_site):
    proc = run_cli("plugins", env=with_plugins(plugin_site, "nanoverl-fixture-dup"))
    assert_user_error(proc, "'exact_match'", "nanoverl", "nanoverl-fixture-dup")


def test_broken_plugin_is_reported_by_name_and_blocks_training_only(plugin_site, tmp_path):
    env = with_plugins(plugin_site, "nanoverl-fixture-broken")
    info = plugins_json(env)
    assert "ModuleNotFoundError" in info["nanoverl-fixture-broken"]["error"]
    proc = run_cli("--config", DEBUG, "--dry-run", env=env)
    assert_user_error(proc, "nanoverl-fixture-broken", "NANOVERL_DISABLE_PLUGINS=nanoverl-fixture-broken")
    env_disabled = with_plugins(plugin_site, "nanoverl-fixture-broken",
                                NANOVERL_DISABLE_PLUGINS="nanoverl-fixture-broken")
    assert run_cli("--config", DEBUG, "--dry-run", env=env_disabled).returncode == 0


def test_misspelt_hook_fails_loudly(plugin_site):
    proc = run_cli("plugins", env=with_plugins(plugin_site, "nanoverl-fixture-badhook"))
    assert_user_error(proc, "nanoverl-fixture-badhook", "register_reward")


def test_load_and_disable_lists(plugin_site):
    env = with_plugins(plugin_site, "nanoverl-fixture", "nanoverl-fixture-dup")
    only = plugins_json({**env, "NANOVERL_LOAD_PLUGINS": "nanoverl-fixture"})
    assert "nanoverl-fixture" in only and "nanoverl-fixture-dup" not in only
    blocked = plugins_json({**env, "NANOVERL_DISABLE_PLUGINS": "nanoverl-fixture-dup"})
    assert "nanoverl-fixture" in blocked and "nanoverl-fixture-dup" not in blocked


def test_unknown_name_lists_available_close_match_and_install_line():
    registry = Registry()
    registry.add("advantage_estimator", "gae", "x:y", "nanoverl")
    registry.add("advantage_estimator", "grpo_passk", "x:y", "somebody")
    with pytest.raises(PluginError) as err:
        registry.get("advantage_estimator", "grpo", key="algorithm.advantage_estimator")
    msg = str(err.value)
    assert "algorithm.advantage_estimator = 'grpo'" in msg
    assert "available: gae, grpo_passk" in msg
    assert "did you mean 'grpo_passk'" in msg
    assert 'pip install "nanoverl[grpo]"' in msg


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_tracker_plugin_that_is_not_installed_names_its_install_line(tracker):
    registry = Registry()
    registry.add("tracker", "console", "x:y", "nanoverl")
    with pytest.raises(PluginError) as err:
        registry.get("tracker", tracker, key="tracking.trackers")
    msg = str(err.value)
    assert f"tracking.trackers = '{tracker}': no tracker of that name is registered; available: console" in msg
    assert f'it is provided by nanoverl-{tracker}: pip install "nanoverl[{tracker}]"' in msg
    assert f'plugins/nanoverl-{tracker}"' in msg  # the checkout's folder, editable


def test_lazy_string_is_imported_only_when_selected():
    registry = Registry()
    registry.add("reward", "lazy", "nanoverl_core.builtins.rewards:char_match", "nanoverl")
    assert "lazy" in registry.names("reward")
    fn = registry.get("reward", "lazy")
    assert fn("p", "123", {"target": "124"}) == pytest.approx(2 / 3)


def test_lazy_string_whose_module_is_missing_says_what_to_install():
    registry = Registry()
    registry.add("rollout", "vllm", "nanoverl_not_installed.rollout:make", "nanoverl-vllm")
    with pytest.raises(PluginError, match=r'pip install "nanoverl\[vllm\]"'):
        registry.get("rollout", "vllm")


def test_fresh_registry_from_the_environment_resolves_builtins():
    registry = load_registry()
    assert registry.entry("worker", "debug").provider == "nanoverl"
    assert callable(registry.get("advantage_estimator", "gae"))


def test_outside_policy_loss_and_rollout_with_their_own_settings_train_by_name(plugin_site, tmp_path):
    """A pip-installed package registers a policy loss and a rollout, each with a settings class;
    both are listed with descriptions, validated like core keys, shown by --dry-run and used in a run."""
    env = with_plugins(plugin_site, "nanoverl-fixture-ext")
    info = plugins_json(env)["nanoverl-fixture-ext"]
    assert info["names"] == {"policy_loss": ["capped_is"], "rollout": ["capped_debug"]}
    assert info["descriptions"]["policy_loss"]["capped_is"].startswith("Capped IS")
    assert "capped at [rollout.capped_debug] max_tokens" in info["descriptions"]["rollout"]["capped_debug"]
    listing = run_cli("plugins", env=env).stdout
    assert "    capped_is - Capped IS: detached IS weight capped" in listing

    args = ["--config", DEBUG, "actor.policy_loss=capped_is", "rollout.name=capped_debug", "actor.ppo_epochs=2",
            "rollout.capped_debug.max_tokens=2", "actor.capped_is.eps_high=0.05", "trainer.total_steps=2",
            "trainer.val_every=0", f"trainer.output_dir={tmp_path}"]
    dry = run_cli(*args, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    resolved = json.loads(dry.stdout)
    assert resolved["config"]["rollout"]["capped_debug"] == {"max_tokens": 2}
    assert resolved["config"]["actor"]["capped_is"] == {"eps_high": 0.05}
    assert {"kind": "policy_loss", "name": "capped_is", "provider": "nanoverl-fixture-ext"} in resolved["plugins"]

    proc = run_cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/response_length/max"] <= 2 for r in rows)  # the rollout's setting took effect
    assert all(r["actor/capped_is_eps_high"] == pytest.approx(0.05) for r in rows)  # and the loss's
    assert "actor/capped_is_clipfrac" in rows[-1] and "actor/pg_clipfrac" not in rows[-1]

    bad = run_cli(*args, "actor.capped_is.eps_hihg=0.1", env=env)
    assert_user_error(bad, "unknown config key 'actor.capped_is.eps_hihg'", "did you mean 'actor.capped_is.eps_high'?")
    bad = run_cli(*args, "rollout.capped_debug.max_tokens=0", env=env)
    assert_user_error(bad, "config key 'rollout.capped_debug.max_tokens'", "must be > 0")
