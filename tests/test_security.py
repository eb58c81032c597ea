"""Security: nothing nanoverl reads is unpickled, no config value runs as code, plugins come only from
installed entry points or a file the user names (with a warning), and nothing listens beyond
127.0.0.1 by default. See docs/faults.md.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import EXAMPLES, ROOT, assert_user_error, cli_env, run_cli

REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
PPO = str(EXAMPLES / "debug_ppo.toml")


# ---- the source never unpickles, evaluates or imports what a user or a file hands it ---------------
UNPICKLING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "<expr>")  # `f().eval` is not the builtin eval
    return ".".join(reversed(parts))


def _kw(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else "<expr>"
    return None


def unsafe_calls(path: Path) -> list[str]:
    """Calls that could run code from data or config: unpickling, eval/exec, unsafe YAML, shells."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] in UNPICKLING_MODULES - {"pickle"}:
                    found.append(f"{where}: imports {name}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, attr = name.rpartition(".")
        if name == "torch.load" and _kw(node, "weights_only") is not True:
            found.append(f"{where}: torch.load without weights_only=True")
        elif head.split(".")[0] in UNPICKLING_MODULES and attr in ("load", "loads", "Unpickler"):
            found.append(f"{where}: {name} unpickles")
        elif name in ("dcp.load", "torch.distributed.checkpoint.load", "checkpoint.load"):
            found.append(f"{where}: {name} unpickles the checkpoint's .metadata file")
        elif name in ("eval", "exec", "compile", "__import__", "os.system", "os.popen"):
            found.append(f"{where}: {name}()")
        elif name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
            found.append(f"{where}: {name} (use yaml.safe_load)")
        elif attr == "load" and head in ("np", "numpy") and _kw(node, "allow_pickle") not in (None, False):
            found.append(f"{where}: {name} with allow_pickle")
        elif _kw(node, "trust_remote_code") is True:
            found.append(f"{where}: trust_remote_code=True hard-coded (it must come from model.trust_remote_code)")
        elif _kw(node, "shell") is True:
            found.append(f"{where}: a shell command")
    return found


SOURCE_TREES = {
    "core": [ROOT / "nanoverl_core"],
    "nanoverl-hf": [ROOT / "plugins" / "nanoverl-hf" / "src"],
    "nanoverl-grpo": [ROOT / "plugins" / "nanoverl-grpo" / "src"],
    "nanoverl-vllm": [ROOT / "plugins" / "nanoverl-vllm" / "src"],
    "nanoverl-fsdp": [ROOT / "plugins" / "nanoverl-fsdp" / "src"],
    "nanoverl-tensorboard": [ROOT / "plugins" / "nanoverl-tensorboard" / "src"],
    "nanoverl-wandb": [ROOT / "plugins" / "nanoverl-wandb" / "src"],
    "examples and scripts": [ROOT / "examples", ROOT / "scripts"],
}


@pytest.mark.parametrize("tree", list(SOURCE_TREES))
def test_source_never_unpickles_or_evaluates(tree):
    files = [f for root in SOURCE_TREES[tree] if root.is_dir() for f in sorted(root.rglob("*.py"))]
    if not files:
        pytest.skip(f"{tree} is not in this checkout")
    problems = [p for f in files for p in unsafe_calls(f)]
    assert problems == [], "\n".join(problems)


def test_code_is_imported_only_from_entry_points_and_reward_file():
    """Config strings are looked up in the registry, never imported; the dynamic imports in the core are the
    registry's own lazy "module:attr" strings (written by plugin authors), reward.file, environment.file and
    agent.file (plugins.import_file, the file the user named), and a reward worker or environment worker importing the
    module of an object the registry already resolved (its registered "module:attr" or its __module__, never
    a config value)."""
    dynamic = {}
    for f in sorted((ROOT / "nanoverl_core").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] in (
                    "import_module", "spec_from_file_location", "exec_module", "load_source", "run_path"):
                dynamic.setdefault(str(f.relative_to(ROOT)), []).append(_dotted(node.func).split(".")[-1])
    assert dynamic == {"nanoverl_core/__init__.py": ["import_module"],       # its own lazy public names
                       "nanoverl_core/agents/__init__.py": ["import_module"],   # its own lazy public names
                       "nanoverl_core/env/__init__.py": ["import_module"],   # its own lazy public names
                       "nanoverl_core/plugins.py": ["import_module",  # import_ref: registered "module:attr"
                                                    "spec_from_file_location", "exec_module"],  # import_file
                       "nanoverl_core/reward/__init__.py": ["import_module"]}  # its own lazy public names


# ---- checkpoints: only safe formats, and a planted pickle never runs -----------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("security") / "run"
    proc = run_cli("--config", PPO, "trainer.progress=none", "trainer.total_steps=1", "data.batch_size=8",
                   "rollout.n=2", "trainer.val_every=1", f"trainer.output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_run_directory_holds_only_safetensors_json_and_weights_only_tensors(run_dir):
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} <= {".safetensors", ".json", ".jsonl", ".pt", ".png"}, sorted(map(str, files))
    for p in files:
        if p.suffix == ".safetensors":
            load_file(str(p))
        elif p.suffix == ".pt":
            torch.load(p, weights_only=True)  # raises on anything but tensors and plain containers
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".png":                          # metrics.png: an image, nothing that runs
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
        else:
            [json.loads(line) for line in p.read_text().splitlines()]
    assert any(p.name == "optimizer.pt" for p in files) and any(p.name == "model.safetensors" for p in files)


PAYLOAD = """
import os, sys, torch

class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))

torch.save({"state": {0: {"exp_avg": Payload()}}, "param_groups": []}, sys.argv[1])
"""


@pytest.mark.parametrize("target", ["actor/optimizer.pt", "critic/model.safetensors"])
def test_a_planted_pickle_in_a_checkpoint_is_refused_and_never_runs(run_dir, tmp_path, target):
    resumed = tmp_path / "run"
    shutil.copytree(run_dir, resumed)
    marker = tmp_path / "PAYLOAD_RAN"
    victim = resumed / "checkpoints" / "step_000001" / target
    subprocess.run([sys.executable, "-c", PAYLOAD, str(victim), str(marker)], check=True, env=cli_env())
    proc = run_cli("--config", PPO, "trainer.progress=none", "trainer.total_steps=2", "data.batch_size=8",
                   "rollout.n=2", f"trainer.output_dir={resumed}")
    needle = "holds pickled Python objects besides tensors" if target.endswith(".pt") else "cannot be loaded"
    assert_user_error(proc, "step_000001", needle)
    assert not marker.exists(), "the payload ran"
    # the file really is hostile: an ordinary unpickling runs it (copied to .pt: torch.load hands a
    # .safetensors name to safetensors)
    proof = shutil.copy(victim, tmp_path / "proof.pt")
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(proof)!r}, weights_only=False)"],
                   env=cli_env(), capture_output=True)
    assert marker.exists()


# ---- config values are data -------------------------------------------------------------------------
def test_config_values_are_never_evaluated(tmp_path):
    marker = tmp_path / "EVALUATED"
    code = f"__import__('os').system('touch {marker}')"
    proc = run_cli("--config", str(EXAMPLES / "debug_copy_turns.toml"), "--dry-run", f"trainer.output_dir={code}",
                   f"data.prompt_key={code}", f"environment.copy_turns.separator={{{{ {code} }}}}")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)["config"]
    assert cfg["trainer"]["output_dir"] == code and cfg["data"]["prompt_key"] == code
    assert cfg["environment"]["copy_turns"]["separator"] == "{{ " + code + " }}"  # a component's setting too
    assert not marker.exists()


def test_yaml_tags_that_build_python_objects_are_refused(tmp_path):
    marker = tmp_path / "CONSTRUCTED"
    tag = f'!!python/object/apply:os.system ["touch {marker}"]'
    assert_user_error(run_cli("--config", REINFORCE, f"trainer.total_steps={tag}", "--dry-run"), "trainer.total_steps")
    config = tmp_path / "evil.yaml"
    config.write_text(f"trainer:\n  total_steps: {tag}\n")
    assert_user_error(run_cli("--config", str(config), "--dry-run"), "cannot be parsed")
    assert not marker.exists()


@pytest.mark.parametrize("override, needle", [
    ("reward.name=os:system", "reward.name = 'os:system': no reward of that name"),
    ("worker.name=nanoverl_core.builtins.debug:make_workers", "worker.name = 'nanoverl_core.builtins.debug:make_workers'"),
    ("tracking.trackers=[subprocess:Popen]", "tracking.trackers = 'subprocess:Popen'"),
])
def test_a_module_path_in_the_config_is_a_name_to_look_up_not_code_to_import(override, needle):
    assert_user_error(run_cli("--config", REINFORCE, override, "--dry-run"), needle)


def test_a_package_on_the_path_without_an_entry_point_is_never_loaded(tmp_path):
    marker = tmp_path / "IMPORTED"
    pkg = tmp_path / "site" / "nanoverl_sneaky"
    pkg.mkdir(parents=True)
    body = f"open({str(marker)!r}, 'w').close()\nfrom nanoverl_core import hookimpl\n\n" \
           "@hookimpl\ndef register_rewards(register):\n    register('sneaky', lambda p, r, s: 1.0)\n"
    (pkg / "__init__.py").write_text(body)
    (pkg / "plugin.py").write_text(body)
    env = cli_env(PYTHONPATH=str(tmp_path / "site"))
    listing = run_cli("plugins", "--json", env=env)
    assert listing.returncode == 0 and "sneaky" not in listing.stdout
    assert_user_error(run_cli("--config", REINFORCE, "reward.name=sneaky", "--dry-run", env=env),
                      "reward.name = 'sneaky': no reward of that name")
    assert not marker.exists()


def test_reward_file_warns_that_it_runs_code(tmp_path):
    reward = tmp_path / "mine.py"
    reward.write_text("def compute_score(prompt, response, sample):\n    return 1.0\n")
    proc = run_cli("--config", REINFORCE, f"reward.file={reward}", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: reward.file runs the Python code in {reward}; only use files you trust" in proc.stderr


# ---- nothing listens beyond this machine by default ------------------------------------------------
HOST = re.compile(r"(--host[ =]|\.bind\(\(?\s*)[\"']?([\w.:\[\]-]*)")  # `--host X`, `sock.bind((X, port))`
LOCAL = {"127.0.0.1", "localhost", "::1", "[::1]", ""}
# the one place 0.0.0.0 may appear: the docs' recipe for a dedicated MLflow server the user runs
# themselves (it says to put it behind --allowed-hosts), and the advice not to do that for the UI
ALLOWED_WIDE = {("docs/mlflow.md", "--host 0.0.0.0 --allowed-hosts"), ("docs/mlflow.md", "rather than `--host 0.0.0.0`"),
                ("docs/faults.md", "The only `0.0.0.0` in the")}  # the guarantee, stated


def test_nothing_binds_beyond_localhost_by_default():
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "nanoverl_core").rglob("*.py"),
             *(ROOT / "plugins").glob("*/src/**/*.py"), *(ROOT / "plugins").glob("*/README.md"),
             *(ROOT / "examples").rglob("*.py"), *(ROOT / "examples").rglob("*.md"), *(ROOT / "scripts").rglob("*.py"),
             *(ROOT / ".ci").rglob("*")]
    problems = []
    for f in files:
        if not f.is_file():
            continue
        rel = str(f.relative_to(ROOT))
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if any(rel == path and snippet in line for path, snippet in ALLOWED_WIDE):
                continue
            wide = "0.0.0.0" in line or any(m.group(2) not in LOCAL for m in HOST.finditer(line))
            if wide:
                problems.append(f"{rel}:{n}: {line.strip()}")
    assert problems == [], "\n".join(problems)
    tracker = (ROOT / "plugins" / "nanoverl-mlflow" / "src" / "nanoverl_mlflow" / "tracker.py").read_text()
    assert "--host 127.0.0.1" in tracker  # the `mlflow ui` command it prints
