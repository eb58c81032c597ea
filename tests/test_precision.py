"""What `model.compute_dtype = "auto"` picks, and whether bf16 is fast here, on both kinds of CPU.

A machine with AVX512-BF16 is made to run as one without by capping oneDNN's instruction set
(ONEDNN_MAX_CPU_ISA): the tests check that the cap changes the matmul kernel oneDNN runs (its verbose
log) and that the detection follows it. On an AVX2-only machine the capped and uncapped runs agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, cli_env, run_cli
from nanoverl_core.config import Config
from nanoverl_core.workers.precision import cpu_has_fast, pick_compute_dtype, resolve_compute_dtype

FLAGS = set(next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])) if Path("/proc/cpuinfo").exists() else set()
NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & FLAGS)
PROBE = """
import sys, torch
from nanoverl_core.workers.precision import cpu_has_fast, pick_compute_dtype
a = torch.randn(64, 64, dtype=torch.bfloat16)
a @ a
print("RESULT", cpu_has_fast("bfloat16"), pick_compute_dtype("cpu")[0] or "float32", file=sys.stderr)
"""


def probe(**env: str) -> tuple[bool, str, list[str]]:
    """(cpu_has_fast("bfloat16"), what auto picks, oneDNN's matmul kernels) in a fresh process under `env`."""
    proc = subprocess.run([sys.executable, "-c", PROBE], env=cli_env(ONEDNN_VERBOSE="1", **env),
                          capture_output=True, text=True, timeout=120, check=True)
    fast, pick = next(line.split()[1:] for line in proc.stderr.splitlines() if line.startswith("RESULT"))
    kernels = [line.split(",")[6] for line in proc.stdout.splitlines() if ",exec,cpu,matmul," in line]  # its log
    return fast == "True", pick, kernels


@pytest.mark.skipif(sys.platform != "linux" or not FLAGS, reason="reads the CPU's flags from /proc/cpuinfo")
def test_bf16_is_fast_exactly_where_onednn_runs_it_with_the_cpus_bf16_instructions():
    fast, pick, kernels = probe()
    assert fast == NATIVE_BF16 and pick == ("bfloat16" if NATIVE_BF16 else "float32")
    assert any("avx512_core_bf16" in k or "amx" in k for k in kernels) == NATIVE_BF16, kernels
    capped, pick, kernels = probe(ONEDNN_MAX_CPU_ISA="AVX2")        # the same machine without them
    assert not capped and pick == "float32"
    assert not any("bf16" in k.split(":", 1)[-1] for k in kernels), kernels   # no bf16 kernel of oneDNN's
    assert cpu_has_fast("bfloat16") == NATIVE_BF16                  # this process: uncapped


def test_auto_resolves_once_to_what_this_machine_computes_in(capsys):
    config = Config()
    config.model.compute_dtype = "auto"
    resolve_compute_dtype(config)
    picked = pick_compute_dtype("cpu")[0]
    assert config.model.compute_dtype == picked
    assert capsys.readouterr().err.startswith(f"model.compute_dtype = auto: {picked or 'float32'} (")
    resolve_compute_dtype(config)                                     # resolved: nothing more to say
    assert capsys.readouterr().err == ""
    weights = Config()
    weights.model.compute_dtype, weights.model.dtype = "auto", "bfloat16"
    resolve_compute_dtype(weights)
    assert weights.model.compute_dtype == ""                         # bf16 weights: nothing to cast


@pytest.mark.parametrize("isa", ["ALL", "AVX2"])
def test_a_run_with_auto_says_what_it_picked_and_records_it(tmp_path, isa):
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "trainer.progress=none", "trainer.total_steps=1",
                   "trainer.val_every=0", "model.compute_dtype=auto", f"trainer.output_dir={tmp_path}",
                   env=cli_env(ONEDNN_MAX_CPU_ISA=isa))
    assert proc.returncode == 0, proc.stderr[-2000:]
    picked = "bfloat16" if NATIVE_BF16 and isa == "ALL" else ""
    assert f"model.compute_dtype = auto: {picked or 'float32'} (" in proc.stderr
    assert json.loads((tmp_path / "config.json").read_text())["config"]["model"]["compute_dtype"] == picked
