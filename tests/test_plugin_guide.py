"""docs/plugins.md stays true: its hooks match the hook specs, and its two example plugins work as written.

An example plugin is the fenced blocks of the guide whose first line is `# file: <path>`: the reward
plugin's are those before the heading of the policy-loss example, the loss plugin's those under it.
Each is written to a tmp folder, installed with `pip install --no-deps --target`, and run through the
real CLI in subprocesses with that folder on PYTHONPATH (entry points come from the installed dist-info).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, cli_env, read_metrics, run_cli
from nanoverl_core import hookspecs

GUIDE = ROOT / "docs" / "plugins.md"
HOOK_HEADING = re.compile(r"^### `(register_\w+)\((.*)\) -> (.+)`$", re.M)
KIND_ROW = re.compile(r"^\| `(register_\w+)` \| `(\w+)` \|", re.M)
FILE_BLOCK = re.compile(r"^```\w*\n# file: (\S+)\n(.*?)^```$", re.M | re.S)
LOSS_HEADING = "## A policy loss with its own settings"
ENV_HEADING = "## A multi-turn environment"


def spec_signature(fn) -> tuple[str, str]:
    """('register: Register', 'None') from the hook spec's own annotations."""
    def text(annotation) -> str:
        return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {text(p.annotation)}" for p in sig.parameters.values())
    return params, text(sig.return_annotation)


def hook_specs() -> dict[str, object]:
    marker = f"{hookspecs.PROJECT}_spec"  # the attribute pluggy's HookspecMarker sets
    return {name: fn for name, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, marker)}


# ---- (a) the guide and the hook specs agree -------------------------------------------------------
def test_guide_documents_every_hook_with_its_exact_signature_and_no_other():
    guide = GUIDE.read_text()
    documented = {name: (params, ret) for name, params, ret in HOOK_HEADING.findall(guide)}
    specs = hook_specs()
    assert sorted(specs) == sorted(hookspecs.HOOKS), "hookspecs.HOOKS and the @hookspec functions differ"
    assert sorted(documented) == sorted(specs), "docs/plugins.md headings vs nanoverl_core.hookspecs"
    for name, fn in specs.items():
        assert documented[name] == spec_signature(fn), name


def test_guide_maps_every_hook_to_its_registry_kind():
    assert dict(KIND_ROW.findall(GUIDE.read_text())) == hookspecs.HOOKS


def test_guide_and_hookspecs_state_the_same_register_signature():
    line = 'register(name: str, obj, *, description: str = "", settings=None) -> None'
    assert line in hookspecs.__doc__ and line in GUIDE.read_text()


# ---- (b) the guide's example plugins work as written ---------------------------------------------
def guide_files(example: str) -> list[tuple[str, str]]:
    """(path, body) of the `# file:` blocks of the guide's "reward", "loss" or "env" example plugin."""
    guide = GUIDE.read_text()
    if example == "reward":
        return FILE_BLOCK.findall(guide[:guide.index(LOSS_HEADING)])
    start = guide.index(LOSS_HEADING if example == "loss" else ENV_HEADING)
    return FILE_BLOCK.findall(guide[start:guide.index("\n## ", start + 1)])


def install(tmp: Path, files: list[tuple[str, str]]) -> tuple[Path, dict[str, str]]:
    """The files written to <tmp>/pkg and pip-installed into <tmp>/site; returns (pkg, env)."""
    for path, body in files:
        (tmp / "pkg" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "pkg" / path).write_text(f"# file: {path}\n{body}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", "--target", str(tmp / "site"), str(tmp / "pkg")],
                   check=True, capture_output=True, text=True)
    return tmp / "pkg", cli_env(PYTHONPATH=str(tmp / "site"))


@pytest.fixture(scope="module")
def guide_plugin(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The guide's reward plugin, installed; returns (pkg, env)."""
    files = guide_files("reward")
    assert {path for path, _ in files} >= {"pyproject.toml", "src/nanoverl_prefix_reward/plugin.py"}, files
    return install(tmp_path_factory.mktemp("guide-plugin"), files)


@pytest.fixture(scope="module")
def guide_loss_plugin(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The guide's policy-loss plugin, installed; returns (pkg, env)."""
    files = guide_files("loss")
    assert {path for path, _ in files} >= {"pyproject.toml", "src/nanoverl_ppo_penalty/plugin.py",
                                           "src/nanoverl_ppo_penalty/settings.py"}, files
    return install(tmp_path_factory.mktemp("guide-loss-plugin"), files)


@pytest.fixture(scope="module")
def guide_env_plugin(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The guide's environment plugin, installed; returns (pkg, env)."""
    files = guide_files("env")
    assert {path for path, _ in files} >= {"pyproject.toml", "src/nanoverl_guess_digit/plugin.py"}, files
    return install(tmp_path_factory.mktemp("guide-env-plugin"), files)


def test_guide_plugin_is_listed_with_its_version_hook_and_name(guide_plugin):
    _, env = guide_plugin
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    listed = {p["dist"]: p for p in json.loads(proc.stdout)}
    assert listed["nanoverl-prefix-reward"] == {
        "dist": "nanoverl-prefix-reward", "version": "0.1.0", "module": "nanoverl_prefix_reward.plugin",
        "hooks": ["register_rewards"], "names": {"reward": ["prefix_match"]},
        "descriptions": {"reward": {"prefix_match": "share of the target matched before the first wrong character"}},
        "error": ""}


@pytest.mark.parametrize("plugin", ["guide_plugin", "guide_loss_plugin", "guide_env_plugin"])
def test_each_guide_plugins_own_tests_pass_as_written(plugin, request):
    pkg, env = request.getfixturevalue(plugin)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg / "tests")],
                          cwd=pkg, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "3 passed" in proc.stdout


def test_guide_plugin_reward_is_used_by_name_in_a_debug_run(guide_plugin, tmp_path):
    _, env = guide_plugin
    run_dir = tmp_path / "run"
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "reward.name=prefix_match",
                   "trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0",
                   "trainer.rollout_samples=-1", "tracking.trackers=[jsonl]", f"trainer.output_dir={run_dir}", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("reward/exact" in m for m in metrics)  # the dict's extra key, logged by name
    # Every logged score is prefix_match's: recompute it from the prompt ("660=" -> target "660").
    rows = [json.loads(line) for line in (run_dir / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert rows
    for row in rows:
        target, response = row["prompt"].rstrip("="), row["response"].strip()
        expected = len(os.path.commonprefix([target, response])) / len(target)
        assert row["score"] == pytest.approx(expected), row
    assert json.loads((run_dir / "config.json").read_text())["plugins"]["nanoverl-prefix-reward"] == "0.1.0"


# ---- (c) the guide's policy loss with settings works as written --------------------------------------
LOSS_OVERRIDES = ["actor.policy_loss=ppo_penalty", "actor.ppo_penalty.beta=0.05"]  # as the guide writes them


def test_guide_loss_plugin_is_listed_with_its_hook_and_name(guide_loss_plugin):
    _, env = guide_loss_plugin
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    listed = {p["dist"]: p for p in json.loads(proc.stdout)}["nanoverl-ppo-penalty"]
    assert (listed["hooks"], listed["names"], listed["error"]) == (["register_policy_losses"],
                                                                   {"policy_loss": ["ppo_penalty"]}, "")


def test_guide_loss_and_its_setting_reach_a_debug_run(guide_loss_plugin, tmp_path):
    """--dry-run shows the [actor.ppo_penalty] table; in a run, the loss is logged as actor/pg_loss next to
    its own actor/penalty_kl, and beta moves pg_loss by exactly beta times the logged token-mean KL."""
    _, env = guide_loss_plugin
    assert f"`{' '.join(LOSS_OVERRIDES)}`" in GUIDE.read_text()
    base = ["--config", str(EXAMPLES / "debug_reinforce.toml"), "actor.ppo_epochs=2", "trainer.total_steps=1",
            "trainer.val_every=0", "trainer.save_every=0", "trainer.rollout_samples=0", "tracking.trackers=[jsonl]"]
    dry = run_cli(*base, *LOSS_OVERRIDES, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    resolved = json.loads(dry.stdout)
    assert resolved["config"]["actor"]["ppo_penalty"] == {"beta": 0.05}
    assert {"kind": "policy_loss", "name": "ppo_penalty", "provider": "nanoverl-ppo-penalty"} in resolved["plugins"]

    runs = {}
    for beta in (0.05, 0.0):
        run_dir = tmp_path / f"beta{beta}"
        proc = run_cli(*base, "actor.policy_loss=ppo_penalty", f"actor.ppo_penalty.beta={beta}",
                       f"trainer.output_dir={run_dir}", env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        [runs[beta]] = read_metrics(run_dir)
    with_penalty, without = runs[0.05], runs[0.0]
    assert "actor/pg_clipfrac" not in with_penalty and with_penalty["actor/penalty_kl"] > 0
    # the first epoch is on the sampling policy (KL 0, no KL gradient), so both runs reach the second
    # with the same weights: the loss differs by beta * KL there, and both are averaged over 2 steps
    assert with_penalty["actor/penalty_kl"] == pytest.approx(without["actor/penalty_kl"], rel=1e-4)
    assert with_penalty["actor/pg_loss"] - without["actor/pg_loss"] == pytest.approx(
        0.05 * with_penalty["actor/penalty_kl"], rel=1e-3)

    bad = run_cli(*base, "actor.policy_loss=ppo_penalty", "actor.ppo_penalty.beta=-1", "--dry-run", env=env)
    assert bad.returncode == 2 and "actor.ppo_penalty.beta" in bad.stderr, bad.stderr


# ---- (d) the guide's environment plays episodes by name ------------------------------------------------
def test_guide_environment_plays_episodes_by_name_in_a_debug_run(guide_env_plugin, tmp_path):
    """The overrides of the guide's TOML: episodes of up to 4 turns, each guess answered with + or -,
    scored by the environment alone (a found digit scores 1), logged per step and dumped turn by turn."""
    _, env = guide_env_plugin
    run_dir = tmp_path / "run"
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "environment.name=guess_digit",
                   "environment.max_turns=4", "environment.score_answer=false", "rollout.max_new_tokens=12",
                   "trainer.total_steps=2", "trainer.val_every=0", "trainer.save_every=0",
                   "trainer.rollout_samples=-1", "tracking.trackers=[jsonl]", f"trainer.output_dir={run_dir}", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = read_metrics(run_dir)
    assert {"episode/turns/mean", "episode/env_tokens/mean", "episode/errors"} <= set(metrics[-1])
    rows = [json.loads(line) for line in (run_dir / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(rows) == 128
    for row in rows:
        secret = row["prompt"][0]
        turns = row["episode"]
        # a turn cut by the token budget is not answered (it has no reward): only answered guesses count
        guesses = [t["text"].strip()[:1] for t in turns if t["role"] == "model" and "reward" in t]
        found = secret in guesses
        assert row["score"] == pytest.approx(1.0 if found else 0.0), row
        for turn, answer in zip(turns, turns[1:]):
            if answer["role"] == "environment":
                guess = turn["text"].strip()[:1]
                assert answer["text"] == ("?" if not guess.isdigit() else "+" if guess < secret else "-"), row


# ---- (c) the one-file environment the guide starts with is the example's own code ------------------
def test_the_guides_one_file_environment_is_the_examples_code_verbatim():
    """The guide shows examples/tiny_task/phone_book.py and tiny_tool.toml's [environment] table; both blocks
    are copied from those files (the example runs in tests/test_environment_file.py and the hf tests)."""
    guide = GUIDE.read_text()
    section = guide[guide.index("## A one-off environment with a tool, in one file"):guide.index(
        "## A reward plugin in ten minutes")]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", section, re.M | re.S)
    python = next(body for lang, body in blocks if lang == "python")
    toml = next(body for lang, body in blocks if lang == "toml" and "phone_book.py" in body)
    source = (ROOT / "examples" / "tiny_task" / "phone_book.py").read_text()
    config = (ROOT / "examples" / "configs" / "tiny_tool.toml").read_text()
    for chunk in python.split("\n\n\n"):
        body = "\n".join(line for line in chunk.splitlines() if not line.startswith("# examples/"))
        assert body.strip() in source, body
    assert toml in config
