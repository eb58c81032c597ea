"""The typed config: file formats, overrides with types, unknown keys, impossible combinations."""

from __future__ import annotations

import json
import re
import tomllib

import attrs
import pytest
import yaml

from conftest import EXAMPLES, ROOT
from nanoverl_core.config import (COMPONENTS, MOVED_KEYS, Config, OptimConfig, config_from_dict, drop_moved_keys,
                                  load_config)
from nanoverl_core.config.structure import structure_as
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
    (["rollout.n=0"], "config key .rollout.n.: 0 is not an integer >= 1"),
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


def test_a_components_setting_is_typed_on_the_command_line():
    from conftest import first_party_registry

    registry = first_party_registry()                          # the mlflow tracker's settings, installed or not
    cfg = load_config(DEBUG, ["tracking.trackers=[mlflow]", "tracking.mlflow.run_name=007",
                              "tracking.mlflow.experiment=2024-01-01"], registry=registry)
    assert cfg.tracking.settings["mlflow"].run_name == "007"            # text as written, not the int 7
    assert cfg.tracking.settings["mlflow"].experiment == "2024-01-01"   # nor a YAML date
    quoted = load_config(DEBUG, ["tracking.trackers=[mlflow]", 'tracking.mlflow.run_name="007"',
                                 "trainer.output_dir='runs/a b'"], registry=registry)
    assert quoted.tracking.settings["mlflow"].run_name == "007"         # TOML's quotes are not part of the text
    assert quoted.trainer.output_dir == "runs/a b"


def test_a_settings_validator_error_is_its_message_not_a_tuple():
    @attrs.define
    class Settings:
        mode: str = attrs.field(default="a", validator=attrs.validators.in_(("a", "b")))

    with pytest.raises(ConfigError) as err:
        structure_as({"mode": "c"}, Settings, prefix="rollout.x.")
    assert str(err.value) == ("config key 'rollout.x.mode': 'mode' must be in ('a', 'b') (got 'c'); "
                              "fix the value in the config or override")


# ---- keys that moved --------------------------------------------------------------------------------------
def moved_line(old: str) -> str:
    table, _, key = MOVED_KEYS[old].rpartition(".")
    return f"{old} moved: write it as [{table}] {key} = ... (as an override: {MOVED_KEYS[old]}=...)"


@pytest.mark.parametrize("old", MOVED_KEYS)
def test_a_moved_key_names_its_new_place_in_a_file_and_as_an_override(old, tmp_path):
    section, key = old.split(".")
    data = tomllib.loads(DEBUG.read_text())
    data.setdefault(section, {})[key] = "x"                    # the old key in its old [section]
    (tmp_path / "old.json").write_text(json.dumps(data))
    for path, overrides in ((tmp_path / "old.json", []), (DEBUG, [f"{old}=x"])):
        with pytest.raises(ConfigError) as err:
            load_config(path, overrides, registry=load_registry())
        assert str(err.value) == moved_line(old)


def test_an_old_runs_config_json_loads_without_its_moved_keys():
    """A run's config.json holds every key, so one written before a key moved holds the old key (export reads it)."""
    data = Config().to_dict()
    data["data"]["train_files"] = ["x.jsonl"]
    data["tracking"].update(mlflow_uri="", experiment="nanoverl", run_name="")
    data["rollout"]["share_prompts"] = True
    with pytest.raises(ConfigError, match="moved"):
        config_from_dict(data, registry=load_registry())
    loaded = config_from_dict(drop_moved_keys(data), registry=load_registry()).to_dict()
    assert loaded["tracking"] == {"trackers": ["console", "jsonl", "plot"], "plot": {"every_s": 30.0}}


# ---- docs/config.md, the key reference ----------------------------------------------------------------------
def doc_tables() -> dict[str, str]:
    """docs/config.md's tables: every `[section]` or `[section.name]` in a row's first cell -> that row's
    second cell (its keys)."""
    rows = {}
    for line in (ROOT / "docs" / "config.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        for table in re.findall(r"`\[([\w.]+)\]`", cells[0]) if len(cells) > 1 else ():
            rows[table] = cells[1]
    return rows


def schema_tables(cls: type = Config, prefix: str = "") -> dict[str, type]:
    """Every table of the core schema: the sections, and the attrs classes inside them (model.lora)."""
    tables = {}
    for field in attrs.fields(cls):
        if isinstance(field.type, type) and attrs.has(field.type):
            tables[prefix + field.name] = field.type
            tables.update(schema_tables(field.type, f"{prefix}{field.name}."))
    return tables


def documents(row: str, table: str, key: str) -> bool:
    return f"`{key}`" in row or f"`[[{table}.{key}]]`" in row


def test_config_md_lists_every_key_of_every_section_and_settings_table():
    rows, registry = doc_tables(), load_registry()
    tables = dict(schema_tables())
    for section, kind in COMPONENTS.items():
        for name in registry.names(kind):
            settings = registry.settings_class(kind, name)
            if settings is not None and registry.entry(kind, name).provider.startswith("nanoverl"):
                tables[f"{section}.{name}"] = settings
    for table, cls in tables.items():
        assert table in rows, f"docs/config.md has no row for [{table}]"
        inherited = attrs.fields_dict(OptimConfig) if "the optimizer keys above" in rows[table] else {}
        for field in attrs.fields(cls):
            nested = isinstance(field.type, type) and attrs.has(field.type)   # a table of its own
            if field.init and not nested and field.name not in inherited:
                assert documents(rows[table], table, field.name), f"docs/config.md: [{table}] lacks `{field.name}`"


def test_config_md_lists_every_moved_key_at_its_new_place_only():
    rows, text = doc_tables(), (ROOT / "docs" / "config.md").read_text()
    for old, new in MOVED_KEYS.items():
        (section, key), (table, _, name) = old.split("."), new.rpartition(".")
        assert f"| `{old}` | `[{table}] {name}` |" in text
        assert f"`{key}`" not in rows[section], f"docs/config.md still lists {old} under [{section}]"
        assert f"`{name}`" in rows[table]
