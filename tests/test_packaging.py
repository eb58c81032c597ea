"""All distributions move in lock-step, and the root extras name them at that version."""

from __future__ import annotations

import tomllib

from conftest import ROOT

import nanoverl_core


def _pyprojects():
    return [ROOT / "pyproject.toml", *sorted((ROOT / "plugins").glob("*/pyproject.toml"))]


def test_every_distribution_has_the_same_version():
    versions = {p.parent.name: tomllib.loads(p.read_text())["project"]["version"] for p in _pyprojects()}
    assert len(versions) == 14, versions
    assert set(versions.values()) == {nanoverl_core.__version__}, versions


def test_root_extras_name_the_plugins_at_that_version():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras, version = root["optional-dependencies"], root["version"]
    for name in ("hf", "fsdp", "vllm", "grpo", "math", "code", "reasoning-gym", "mlflow", "tensorboard", "wandb",
                 "openenv"):
        assert extras[name] == [f"nanoverl-{name}=={version}"]
        assert f"nanoverl-{name}=={version}" in extras["all"]
    assert extras["verifiers"][0] == f"nanoverl-verifiers=={version}" and extras["verifiers"][0] in extras["all"]
    assert set(extras["agents"]) <= set(extras["verifiers"]) and set(extras["agents"]) <= set(extras["all"])
    assert extras["judge"][0] == f"nanoverl-judge=={version}" and set(extras["judge"]) <= set(extras["all"])


def test_each_plugin_has_an_entry_point_named_after_its_distribution():
    for path in _pyprojects()[1:]:
        project = tomllib.loads(path.read_text())["project"]
        entry = project["entry-points"]["nanoverl"]
        module = project["name"].replace("-", "_")
        assert entry == {project["name"]: f"{module}.plugin"}
        assert f"nanoverl=={project['version']}" in project["dependencies"]
