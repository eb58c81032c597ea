"""The typed config: file formats, overrides with types, unknown keys, impossible combinations."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import EXAMPLES
from nanoverl_core.config import Config, load_config
from nanoverl_core.errors import ConfigError
from nanoverl_core.plugins import load_registry

DEBUG = EXAMPLES / "debug_ppo.toml"


def test_toml_yaml_and_json_load_to_the_same_config(tmp_path):
    toml_cfg = load_config(DEBUG, registry=load_registry())
    data = toml_cfg.to_dict()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "c.json").write_text(json.dumps(data))
    assert load_config(tmp_path / "c.yaml", registry=load_registry()) == toml_cfg
    assert load_config(tmp_path / "c.json", registry=load_registry()) == toml_cfg


def test_overrides_convert_types():
    cfg = load_config(DEBUG, ["trainer.total_steps=7", "actor.lr=3e-4", "critic.enable=true",
                              "tracking.trackers=[console]", "trainer.output_dir=runs/007", "actor.betas=[0.9, 0.95]"],
                      registry=load_registry())
    assert cfg.trainer.total_steps == 7 and isinstance(cfg.trainer.total_steps, int)
    assert cfg.actor.lr == pytest.approx(3e-4)
    assert cfg.tracking.trackers == ["console"]
    assert cfg.trainer.output_dir == "runs/007"  # a string key keeps the text as written
    assert cfg.actor.betas == [0.9, 0.95]


@pytest.mark.parametrize("override, needle", [
    ("trainer.totl_steps=3", "did you mean 'trainer.total_steps'"),
    ("trainr.total_steps=3", "did you mean 'trainer'"),
    ("actor.lrr=1", "did you mean 'actor.lr'"),
])
def test_unknown_key_names_its_path_and_a_close_match(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(DEBUG, [override], registry=load_registry())


@pytest.mark.parametrize("override, needle", [
    ("trainer.total_steps=many", "trainer.total_steps"),
    ("critic.enable=3", "critic.enable"),
    ("actor.lr=fast", "actor.lr"),
    ("actor.loss_agg_mode=token-avg", "actor.loss_agg_mode"),
])
def test_wrong_type_names_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(DEBUG, [override], registry=load_registry())


@pytest.mark.parametrize("overrides, needle", [
    (["data.batch_size=16", "actor.mini_batch_size=5"], "actor.mini_batch_size = 5 must divide data.batch_size"),
    (["actor.micro_batch_size=3"], "actor.micro_batch_size = 3 must divide"),
    (["critic.enable=false", "critic.lr=0.1"], "critic.lr is set but critic.enable = false"),
    (["actor.use_kl_loss=true"], "reference.enable = true"),
    (["algorithm.use_kl_in_reward=true"], "reference.enable = true"),
    (["rollout.temperature=0"], "rollout.temperature = 0"),
    (["rollout.n=0"], "rollout.n = 0 must be at least 1"),
    (["data.train_files=[]"], "data.train_files is empty"),
])
def test_impossible_combinations_are_rejected(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(DEBUG, overrides, registry=load_registry())


def test_defaults_are_valid_once_data_is_named():
    cfg = Config()
    cfg.data.train_files = ["x.jsonl"]
    assert cfg.validate() is cfg


def test_every_field_has_a_docstring():
    """Each field is documented where it is declared (the line after it is a string)."""
    import inspect

    import attrs

    from nanoverl_core.config import schema as module

    source = inspect.getsource(module)
    for cls in [Config, *{f.type for f in attrs.fields(Config)}]:
        if cls is Config:
            continue
        lines = inspect.getsource(cls).splitlines()
        for field in attrs.fields(cls):
            decl = [i for i, line in enumerate(lines) if line.strip().startswith(f"{field.name}:")]
            if not decl:  # inherited (ActorConfig from OptimConfig)
                assert f"    {field.name}:" in source
                continue
            assert lines[decl[0] + 1].strip().startswith('"""'), f"{cls.__name__}.{field.name} has no docstring"
