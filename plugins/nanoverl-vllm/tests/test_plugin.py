"""The plugin as the command line sees it, with and without vLLM (these run in the main venv too)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TRAIN = Path(sys.executable).parent / "nanoverl-train"
CONFIG = "examples/configs/tiny_grpo.toml"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def train(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env}
    return subprocess.run([str(TRAIN), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_plugins_lists_the_vllm_rollout_without_importing_vllm(tmp_path):
    result = train("plugins", "--json", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    info = next(p for p in json.loads(result.stdout) if p["dist"] == "nanoverl-vllm")
    assert info["version"] == "0.4.0" and info["module"] == "nanoverl_vllm.plugin"
    assert info["names"] == {"rollout": ["vllm"]} and info["hooks"] == ["register_rollouts"] and not info["error"]
    probe = "import sys; from nanoverl_core import load_registry; load_registry(); print('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_dry_run_resolves_the_vllm_rollout_without_loading_it(tmp_path):
    result = train("--config", CONFIG, "--dry-run", "rollout.name=vllm", f"trainer.output_dir={tmp_path}/run",
                   tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    chosen = {p["kind"]: p["provider"] for p in json.loads(result.stdout)["plugins"]}
    assert chosen["rollout"] == "nanoverl-vllm"


def assert_one_line_exit_2(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; this checks an environment without it")
def test_choosing_vllm_without_vllm_exits_2_with_the_install_line(tmp_path):
    result = train("--config", CONFIG, "rollout.name=vllm", f"trainer.output_dir={tmp_path}/run", tmp_path=tmp_path)
    assert_one_line_exit_2(result, "rollout 'vllm' from nanoverl-vllm cannot be imported", "vLLM is not importable",
                           'pip install "nanoverl[vllm]"', "or set rollout.name=hf")
    assert not (tmp_path / "run").exists()                                  # nothing loaded, nothing written


def test_a_vllm_that_fails_to_import_exits_2_too(tmp_path):
    """A broken install (say a CUDA torchvision next to a CPU torch) raises RuntimeError inside vLLM."""
    shadow = tmp_path / "shadow" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    result = train("--config", CONFIG, "rollout.name=vllm", f"trainer.output_dir={tmp_path}/run", tmp_path=tmp_path,
                   PYTHONPATH=str(shadow.parent))
    assert_one_line_exit_2(result, "vLLM failed to import (RuntimeError: operator torchvision::nms does not exist)",
                           "torchvision", 'pip install "nanoverl[vllm]"')


def test_an_unsupported_vllm_version_is_refused_with_the_supported_range(monkeypatch):
    pytest.importorskip("vllm")
    from nanoverl_vllm import SUPPORTED_VLLM, engine

    engine._check_version("0.32.0+cpu")                                    # local build tags are ignored
    with pytest.raises(ImportError, match=f"supports vllm{SUPPORTED_VLLM}"):
        engine._check_version("0.10.1")
    monkeypatch.setenv("NANOVERL_VLLM_SKIP_VERSION_CHECK", "1")
    engine._check_version("0.10.1")
