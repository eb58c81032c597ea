"""The extension points: component settings, policy losses through the registry, the worker and
rollout contracts, and the defects fixed with them (each test failed before its fix)."""

from __future__ import annotations

import json
import tomllib

import attrs
import pytest
import torch

from conftest import EXAMPLES, ROOT, assert_user_error, replay_steps, run_cli
from nanoverl_core import RLBatch, load_config, load_registry
from nanoverl_core.algos import PolicyLossInputs, compute_actor_loss
from nanoverl_core.algos import vanilla
from nanoverl_core.builtins.debug import make_rollout, make_workers
from nanoverl_core.builtins.debug_settings import DebugModelSettings, DebugRolloutSettings
from nanoverl_core.errors import ConfigError
from nanoverl_core.testing import (check_actor, check_rollout, check_same_run, prompt_batch, score_texts,
                                   with_loss_mask)

PPO = EXAMPLES / "debug_ppo.toml"
REINFORCE = EXAMPLES / "debug_reinforce.toml"


# ---- component settings -----------------------------------------------------------------------
def test_a_component_table_becomes_its_typed_settings_and_round_trips():
    cfg = load_config(PPO, ["worker.debug.hidden_size=32"], registry=load_registry())
    assert cfg.worker.settings == DebugModelSettings(hidden_size=32, num_layers=2)
    data = cfg.to_dict()
    assert data["worker"]["debug"] == {"vocab_size": 0, "hidden_size": 32, "num_layers": 2}
    assert "settings" not in data["worker"]


@pytest.mark.parametrize("override, needle", [
    ("worker.debug.hiden_size=32", "unknown config key 'worker.debug.hiden_size'; did you mean 'worker.debug.hidden_size'?"),
    ("worker.debug.hidden_size=big", "config key 'worker.debug.hidden_size': invalid value for type, expected int"),
    ("worker.debug.hidden_size=0", "config key 'worker.debug.hidden_size': 0 is not an integer >= 1"),
    ("worker.debg.hidden_size=32", "unknown config key 'worker.debg'; did you mean 'worker.debug'?"),
    ("worker.settings=3", "unknown config key 'worker.settings'"),
    ("actor.vanilla.x=1", "[actor.vanilla] is set, but the policy_loss 'vanilla' takes no settings"),
])
def test_component_settings_are_validated_like_core_keys(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(PPO, [override], registry=load_registry())
    assert needle in str(err.value)


def test_settings_of_a_component_that_is_not_selected_are_ignored_with_a_warning(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(PPO.read_text() + "\n[rollout.other]\nspeed = 3\n")  # a registered rollout, not selected
    registry = load_registry()
    registry.add("rollout", "other", "x:y", "somebody")
    cfg = load_config(config, registry=registry)
    assert cfg.rollout.name == "debug" and cfg.rollout.settings == DebugRolloutSettings()
    assert "[rollout.other] is ignored" in capsys.readouterr().err


def test_dry_run_shows_each_components_settings_with_defaults():
    proc = run_cli("--config", str(PPO), "--dry-run", "worker.debug.num_layers=3")
    assert proc.returncode == 0, proc.stderr
    resolved = json.loads(proc.stdout)
    assert resolved["config"]["worker"]["debug"] == {"vocab_size": 0, "hidden_size": 64, "num_layers": 3}
    assert {"kind": "policy_loss", "name": "vanilla", "provider": "nanoverl"} in resolved["plugins"]


def test_the_core_config_names_no_plugin():
    source = "".join(p.read_text() for p in (ROOT / "nanoverl_core" / "config").glob("*.py")).lower()
    for word in ("vllm", "fsdp", "grpo", "gpu_memory_utilization", "param_dtype", "hidden_size", "epsilon"):
        assert word not in source, word


def test_requires_python_matches_the_tomllib_import():
    for pyproject in [ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml")]:
        assert tomllib.loads(pyproject.read_text())["project"]["requires-python"] == ">=3.11", pyproject


# ---- switching a part off by override ---------------------------------------------------------
def test_an_override_that_switches_the_critic_off_wins_over_the_files_critic_keys(capsys):
    cfg = load_config(PPO, ["critic.enable=false", "algorithm.advantage_estimator=reinforce_plus_plus"],
                      registry=load_registry())
    assert not cfg.critic.enable and cfg.critic.lr == 1e-5  # the file's critic.lr = 1e-3 is dropped
    assert "critic.enable=false: ignoring critic.lr set in the config file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="critic.lr is set but critic.enable = false"):
        load_config(PPO, ["critic.enable=false", "critic.lr=0.1"],  # both on the command line: a contradiction
                    registry=load_registry())


# ---- policy losses ----------------------------------------------------------------------------
def test_policy_losses_come_from_the_registry_and_an_unknown_one_exits_2():
    registry = load_registry()
    assert registry.names("policy_loss") == ["cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg",
                                             "gspo", "kl_cov", "sapo", "vanilla"]
    assert registry.get("policy_loss", "vanilla") is vanilla
    proc = run_cli("--config", str(REINFORCE), "--dry-run", "actor.policy_loss=gpso")
    assert_user_error(proc, "actor.policy_loss = 'gpso'", "did you mean 'gspo'?")


def test_actor_loss_adds_entropy_and_kl_terms_to_the_policy_loss():
    # ratio 1 (on-policy), A = [1, -2], one padded token: pg = -(1 - 2) / 2 = 0.5
    log_prob = torch.tensor([[-1.0, -2.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    inputs = PolicyLossInputs(log_prob, log_prob.detach(), torch.tensor([[1.0, -2.0, 5.0]]), mask, on_policy=True)
    cfg = load_config(PPO, ["reference.enable=true", "actor.use_kl_loss=true", "actor.kl_loss_type=k1",
                            "actor.kl_loss_coef=0.5", "actor.entropy_coeff=0.1"], registry=load_registry()).actor
    entropy = torch.tensor([[2.0, 4.0, 100.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])  # k1 = log_prob - ref = 0.5, -1 -> mean -0.25
    loss, m = compute_actor_loss(vanilla, inputs, cfg, entropy=entropy, ref_log_prob=ref)
    torch.testing.assert_close(loss, torch.tensor(0.5 - 0.1 * 3.0 + 0.5 * -0.25))
    assert {k: round(float(v), 6) for k, v in m.items()} == {
        "actor/pg_loss": 0.5, "actor/entropy": 3.0, "actor/kl_loss": -0.25, "actor/loss": 0.075}


def _update(micro_batch_size: int, ppo_epochs: int = 2, replay: list | None = None):
    """One actor update of the debug worker on a fixed batch: (each optimizer step's gradients, metrics,
    the parameters after each step); `replay` (another _update's parameters) takes each step from those."""
    overrides = [f"actor.micro_batch_size={micro_batch_size}", f"actor.ppo_epochs={ppo_epochs}", "data.batch_size=4",
                 "rollout.n=4", "actor.entropy_coeff=0.01", "actor.lr=1e-2", "reference.enable=true",
                 "actor.use_kl_loss=true", "critic.micro_batch_size=0", "actor.mini_batch_size=2"]
    cfg = load_config(PPO, overrides, registry=load_registry())
    workers = make_workers(cfg)
    batch = prompt_batch(workers.tokenizer, ["12=", "3=", "456=", "78="], n=4)
    torch.manual_seed(0)
    batch.update(make_rollout(cfg, workers).generate(batch, _sampling(cfg)))
    g = torch.Generator().manual_seed(0)
    mask = batch["response_mask"]
    batch["old_log_probs"] = workers.actor.compute_log_probs(batch) + 0.3 * torch.randn(mask.shape, generator=g) * mask
    batch["ref_log_probs"] = workers.reference.compute_log_probs(batch)
    batch["advantages"] = torch.randn(mask.shape, generator=g) * mask
    with_loss_mask(batch)                                          # every sampled token counts
    grads, params, step = [], [], workers.actor.clip_and_step
    replay_steps(workers.actor, params, replay)

    def recording_step(nonfinite):  # the accumulated gradient each optimizer step applies
        grads.append({n: p.grad.clone() for n, p in workers.actor.module.named_parameters() if p.grad is not None})
        return step(nonfinite)

    workers.actor.clip_and_step = recording_step
    return grads, workers.actor.update(batch, vanilla), params


def _sampling(cfg):
    from nanoverl_core import SamplingParams
    return SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0)


def test_micro_batches_change_neither_the_gradients_nor_the_metrics():
    """Each micro-batch metric is its share of the mini-batch's value, so the logged numbers do not
    depend on micro_batch_size (before: pg_loss and kl_loss were divided by the micro-batch count).
    Gradients are compared rather than parameters, each step's from the same weights (the split run
    replays the whole run's, conftest.replay_steps): Adam's first steps move each weight by about lr
    whatever its gradient's size, so float rounding on a near-zero gradient would dominate."""
    whole_grads, whole, params = _update(micro_batch_size=0)
    split_grads, split, _ = _update(micro_batch_size=2, replay=params)
    assert whole.keys() == split.keys()
    assert {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl"} <= whole.keys()
    for key in whole:
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key
    assert len(whole_grads) == len(split_grads) == 4  # 2 epochs x 2 mini-batches
    for a, b in zip(whole_grads, split_grads):
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6)


def test_the_on_policy_shortcut_is_an_explicit_flag_that_needs_a_single_step():
    cfg = load_config(PPO, ["actor.ppo_epochs=2"], registry=load_registry())
    workers = make_workers(cfg)
    batch = prompt_batch(workers.tokenizer, ["12="], n=2)
    batch.update(make_rollout(cfg, workers).generate(batch, _sampling(cfg)))
    batch["advantages"] = batch["response_mask"].clone()
    with_loss_mask(batch)                                          # every sampled token counts
    with pytest.raises(ValueError, match="exactly one optimizer step"):
        workers.actor.update(batch, vanilla, on_policy=True)


# ---- contracts --------------------------------------------------------------------------------
@pytest.mark.parametrize("log_probs", [False, True])
def test_the_debug_backends_keep_the_rollout_and_actor_contracts(log_probs):
    cfg = load_config(PPO, [f"rollout.debug.log_probs={str(log_probs).lower()}"], registry=load_registry())
    workers = make_workers(cfg)
    batch = prompt_batch(workers.tokenizer, ["12=", "345=", "6="], n=2)
    batch.update(check_rollout(make_rollout(cfg, workers), batch, max_new_tokens=4))
    if log_probs:  # the engine's log-probs are the trainer's, up to float rounding (before the update)
        torch.testing.assert_close(batch["rollout_log_probs"], workers.actor.compute_log_probs(batch), atol=1e-5, rtol=0)
    metrics = check_actor(workers.actor, batch)                       # one real update
    assert {"actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/lr"} <= metrics.keys()


def test_a_broken_rollout_fails_the_contract_check_by_rule():
    cfg = load_config(PPO, registry=load_registry())
    workers = make_workers(cfg)
    rollout = make_rollout(cfg, workers)

    class Unseeded:
        returns_log_probs = False

        def generate(self, batch, params):
            with torch.random.fork_rng():
                torch.manual_seed(torch.seed())   # draws its own seed: runs cannot be reproduced
                return rollout.generate(batch, params)

        def sync_weights(self, actor):
            pass

        def close(self):
            pass

    with pytest.raises(AssertionError, match="seeded from torch's global generator"):
        check_rollout(Unseeded(), prompt_batch(workers.tokenizer, ["12=", "345="], n=4), max_new_tokens=4)


def test_check_same_run_compares_every_metric_and_sample_of_two_run_directories(tmp_path):
    def write(run, metrics, response="12"):
        (run / "rollouts").mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **m}) + "\n" for s, m in metrics.items()))
        for step in metrics:
            (run / "rollouts" / f"step_{step}.jsonl").write_text(json.dumps({"prompt": "12=", "response": response}))

    base = {1: {"reward/mean": 0.5, "timing/step": 1.0}, 2: {"reward/mean": 0.6, "timing/step": 1.0}}
    write(tmp_path / "a", base)
    write(tmp_path / "b", {1: {**base[1], "timing/step": 9.0}, 2: {**base[2], "reward/mean": 0.6 + 1e-7}})
    assert check_same_run(tmp_path / "a", tmp_path / "b") == 2            # timings differ: not compared
    write(tmp_path / "c", {1: base[1], 2: {**base[2], "reward/mean": 0.61}})
    with pytest.raises(AssertionError, match="step 2 reward/mean"):
        check_same_run(tmp_path / "a", tmp_path / "c")
    write(tmp_path / "d", base, response="13")
    with pytest.raises(AssertionError, match="step 1: different samples"):
        check_same_run(tmp_path / "a", tmp_path / "d")


def test_the_trainer_closes_the_rollout_even_when_a_step_fails(tmp_path, monkeypatch):
    from nanoverl_core.builtins import debug
    from nanoverl_core.trainer.trainer import Trainer

    closed = []
    monkeypatch.setattr(debug.DebugRollout, "close", lambda self: closed.append(True))
    monkeypatch.setattr(debug.DebugRollout, "generate", lambda self, batch, params: 1 / 0)
    cfg = load_config(REINFORCE, [f"trainer.output_dir={tmp_path}", "tracking.trackers=[jsonl]"],
                      registry=load_registry())
    trainer = Trainer(cfg, load_registry())
    with pytest.raises(ZeroDivisionError):
        trainer.fit()
    assert closed == [True]


# ---- validation leaves every generator as it was ---------------------------------------------
def test_validation_forks_every_device_generator_it_reseeds(monkeypatch):
    """Validation re-seeds torch (CPU and every CUDA device), so it must fork all of them. Faked
    here: this machine has no GPU, so torch.cuda reports one device and fork_rng records the fork."""
    from nanoverl_core import dist

    forked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.random, "fork_rng", lambda devices: forked.append(devices) or _nothing())
    dist.fork_rng()
    assert forked == [[0]]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_plugins_lists_every_name_with_its_description():
    proc = run_cli("plugins")
    assert proc.returncode == 0, proc.stderr
    assert "    gspo - sequence-level ratio, the geometric mean of token ratios (GSPO)" in proc.stdout
    assert "  policy_loss: vanilla, gspo" in proc.stdout


@attrs.define
class _Unused:
    pass


def test_a_settings_class_must_be_attrs():
    registry = load_registry()
    registry.add("rollout", "odd", "x:y", "somebody", settings=dict)
    from nanoverl_core.errors import PluginError
    with pytest.raises(PluginError, match="not an attrs class"):
        registry.settings_class("rollout", "odd")
    registry.add("rollout", "fine", "x:y", "somebody", settings=_Unused)
    assert registry.settings_class("rollout", "fine") is _Unused


def test_batches_of_the_contract_helpers_are_left_padded():
    cfg = load_config(PPO, registry=load_registry())
    tokenizer = make_workers(cfg).tokenizer
    batch = prompt_batch(tokenizer, ["1=", "234="], n=1)
    assert isinstance(batch, RLBatch) and batch["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert batch["uid"] == ["p0", "p1"]



@attrs.define
class _BonusSettings:
    bonus: float = 0.0
    """Added to every score."""


def _bonus_reward(prompt, response, sample, settings):
    return float(response == sample["target"]) + settings.bonus


def test_a_reward_with_settings_is_called_with_its_table():
    from nanoverl_core.reward import RewardScorer

    registry = load_registry()
    registry.add("reward", "bonus", _bonus_reward, "somebody", settings=_BonusSettings)
    cfg = load_config(PPO, ["reward.name=bonus", "reward.bonus.bonus=0.25", "tracking.plot.every_s=0"],
                      registry=registry)
    assert cfg.reward.settings == _BonusSettings(bonus=0.25)
    assert cfg.tracking.settings["plot"].every_s == 0  # a tracker's table: settings by tracker name
    batch = RLBatch({"x": torch.zeros(2)}, {"row": [{"target": "12"}, {"target": "3"}], "prompt_text": ["a", "b"],
                                            "index": [0, 1]})
    scores, _ = score_texts(RewardScorer(cfg.reward, registry), batch, ["12", "4"])
    assert scores.tolist() == [1.25, 0.25]
