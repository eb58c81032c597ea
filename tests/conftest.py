"""Shared test helpers: run the real CLI in a subprocess, install fixture plugins with real pip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanoverl_core.testing import assert_user_error  # noqa: F401  (tests import it from here)
from nanoverl_core.testing import without_machine_metrics

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = ROOT / "examples" / "configs"
GSM8K = ROOT / "examples" / "data" / "gsm8k"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = ROOT):
    """`nanoverl-train ARGS` as a user runs it: a real subprocess, stdout/stderr captured."""
    return subprocess.run([sys.executable, "-m", "nanoverl_core.cli", *args], cwd=cwd, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def first_party_registry():
    """The installed plugins' registry plus every first-party plugin of this checkout that is not
    installed (its plugins/<dir>/src appended to sys.path and its registration hooks called), for tests
    that check the names and settings of all of them whichever plugins the nox session installed."""
    import importlib

    from nanoverl_core.hookspecs import HOOKS
    from nanoverl_core.plugins import load_registry

    registry = load_registry()
    installed = {info.dist for info in registry.plugins}
    for src in sorted(ROOT.glob("plugins/*/src")):
        dist = src.parent.name
        if dist in installed:
            continue
        if str(src) not in sys.path:
            sys.path.append(str(src))
        module = importlib.import_module(f"{dist.replace('-', '_')}.plugin")
        for hook, kind in HOOKS.items():
            if hasattr(module, hook):
                getattr(module, hook)(register=lambda name, obj, *, description="", settings=None, _kind=kind,
                                      _dist=dist: registry.add(_kind, name, obj, _dist, description, settings))
    return registry


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_identical_runs(reference: Path, run_dir: Path, checkpoint: str | None = None) -> None:
    """A resumed run ended as the uninterrupted one did: metrics.jsonl equal line for line (timing/,
    throughput/ and perf/ aside) and, with `checkpoint` ("step_000008"), the same actor weights bit for bit there."""
    def without_timing(folder: Path) -> list[str]:  # as JSON text: key order counts, and NaN equals NaN
        return [json.dumps(without_machine_metrics(r))
                for r in read_metrics(folder)]
    assert without_timing(run_dir) == without_timing(reference)
    if checkpoint is not None:
        import torch
        from safetensors.torch import load_file

        a, b = (load_file(str(d / "checkpoints" / checkpoint / "actor" / "model.safetensors"))
                for d in (reference, run_dir))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)




def replay_steps(worker, params_after: list, replay: list | None = None) -> None:
    """Append `worker`'s trainable parameters after each optimizer step to `params_after`; with `replay`
    (another run's `params_after`), continue each step from that run's parameters instead. Two updates
    that should agree then take every step from the same weights and compare step by step. Left alone,
    Adam (which moves a weight by ~lr whatever the size of its gradient) turns float rounding on near-zero
    gradients into weight differences of up to ~lr, which every later step inherits, by an amount that
    changes with the CPU and the thread count."""
    import torch

    params = {name: p for name, p in worker.module.named_parameters() if p.requires_grad}

    def after(optimizer, args, kwargs):
        params_after.append({name: p.detach().clone() for name, p in params.items()})
        if replay is not None:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(replay[len(params_after) - 1][name])

    worker.optimizer.register_step_post_hook(after)


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """The fixture plugins installed with pip into a private folder (put it on PYTHONPATH to enable them)."""
    site = tmp_path_factory.mktemp("plugin-site")
    sources = tmp_path_factory.mktemp("plugin-src")
    for name in ("nanoverl-fixture", "nanoverl-fixture-dup", "nanoverl-fixture-broken", "nanoverl-fixture-badhook",
                 "nanoverl-fixture-ext", "nanoverl-fixture-gen"):
        source = shutil.copytree(FIXTURES / name, sources / name)  # build outside the checkout
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(site / name), str(source)], check=True, capture_output=True)
    return site


def with_plugins(site: Path, *names: str, **extra: str) -> dict[str, str]:
    paths = os.pathsep.join(str(site / n) for n in names)
    return cli_env(PYTHONPATH=paths, **extra)


SERIAL = {"test_reward_runtime", "test_reward_foreign", "test_reward_components", "test_multiturn",
          "test_reliability_faults", "test_reliability_inputs", "test_security", "test_data_sources"}
"""Modules whose tests race a short deadline on purpose (a reward or environment past its timeout_s, a
worker killed mid-call, a server's start, a prefetch thread): marked `serial`, so nox's core session runs
them after the rest, which it spreads over the cores (pytest-xdist), on an otherwise idle machine."""


def pytest_collection_modifyitems(config, items):
    """Tests marked `hf` need the nanoverl-hf plugin; they skip where it is not installed (nox's core session).
    Tests of the SERIAL modules are marked `serial`."""
    import importlib.util

    for item in items:
        if item.module.__name__.rpartition(".")[2] in SERIAL:
            item.add_marker(pytest.mark.serial)
    if importlib.util.find_spec("nanoverl_hf") is not None:
        return
    skip = pytest.mark.skip(reason="needs nanoverl-hf (run by nox -s hf_grpo)")
    for item in items:
        if "hf" in item.keywords:
            item.add_marker(skip)
