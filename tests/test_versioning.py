"""The plugin API is versioned: the surface a version ships is pinned, every change since the version
before is in CHANGELOG.md, and a plugin written to the version before gets one line, never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nanoverl_core
from conftest import EXAMPLES, ROOT, cli_env, run_cli
from surface import SNAPSHOTS, public_surface
from nanoverl_core.algos import PolicyLossInputs
from nanoverl_core.errors import NanoverlDeprecation, PluginError
from nanoverl_core.rollout import check_rollout_columns, responses_to_batch
from nanoverl_core.trainer.resolve import check_actor_update

CHANGELOG = ROOT / "CHANGELOG.md"


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.stem.split("."))


def snapshots() -> list[dict]:
    """Every shipped surface, oldest first."""
    return [json.loads(p.read_text()) for p in sorted(SNAPSHOTS.glob("*.json"), key=_version_key)]


def changelog_section(version: str) -> str:
    text = CHANGELOG.read_text()
    start = text.index(f"\n## {version}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def released_headings() -> list[str]:
    """CHANGELOG.md's section headings, newest first, without the one of changes not released yet
    ("## 0.3.0 (unreleased)" or "## Unreleased", which may head the file)."""
    headings = [part.split("\n", 1)[0] for part in CHANGELOG.read_text().split("\n## ")[1:]]
    return [h for h in headings if not h.endswith("(unreleased)") and h != "Unreleased"]


def test_the_public_surface_is_the_one_this_version_ships():
    """Changing __all__, a hook spec, a protocol or a field of an object handed to plugins changes the plugin
    API: bump the minor version, write CHANGELOG.md, then `python tests/surface.py --update`."""
    shipped = snapshots()[-1]
    assert shipped["version"] == nanoverl_core.__version__, "no snapshot of this version's surface"
    now = public_surface()
    changed = sorted(k for k in {*now, *shipped["surface"]} if now.get(k) != shipped["surface"].get(k))
    assert not changed, (f"the public surface changed ({changed}): bump the minor version, add a CHANGELOG.md "
                         "entry, then run `python tests/surface.py --update`")


def _names(key: str) -> tuple[str, str]:
    """("Class", "member") of "protocol Class.member" / "object Class.field"; ("", name) of "hook x" / "export x"."""
    _, _, what = key.partition(" ")
    cls, _, member = what.rpartition(".")
    return cls, member


def test_every_change_since_the_version_before_is_in_the_changelog():
    """Each name added, removed or changed between the last two shipped surfaces appears in backticks in the
    CHANGELOG.md section of the newer version (a wholly new protocol or object may be named by its class)."""
    before, after = snapshots()[-2:]
    assert released_headings()[0] == after["version"], "CHANGELOG's newest released section is this version's"
    spans = " ".join(re.findall(r"`([^`]+)`", changelog_section(after["version"])))
    old_classes = {_names(k)[0] for k in before["surface"]}
    missing = []
    for key in sorted({*before["surface"], *after["surface"]}):
        if before["surface"].get(key) == after["surface"].get(key):
            continue
        cls, member = _names(key)
        named = [member] if member != "__call__" else []
        if cls and (member == "__call__" or cls not in old_classes):
            named.append(cls)
        if not any(re.search(rf"\b{re.escape(name)}\b", spans) for name in named):
            missing.append(key)
    assert not missing, f"CHANGELOG.md's {after['version']} section does not name: {missing}"


def test_a_removed_field_is_one_line_naming_the_new_one():
    """0.1.0's PolicyLossInputs.response_mask (deprecated in 0.2.0) is gone: reading it or passing it is a
    PluginError (one `error:` line from nanoverl-train) naming loss_mask."""
    mask = torch.tensor([[1.0, 0.0]])
    inputs = PolicyLossInputs(mask, mask, mask, loss_mask=mask)
    assert inputs.loss_mask is mask
    with pytest.raises(PluginError, match=r"^PolicyLossInputs\.response_mask was removed in nanoverl 0\.4\.0: use "
                                          r"loss_mask") as raised:
        inputs.response_mask
    assert "\n" not in str(raised.value)
    with pytest.raises(PluginError, match=r"^PolicyLossInputs\.response_mask was removed.*use loss_mask"):
        PolicyLossInputs(log_prob=mask, old_log_prob=mask, advantages=mask, response_mask=mask)


LEGACY_LOSS = {
    "pyproject.toml": """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "nanoverl-legacy-loss"
version = "0.1.0"
dependencies = ["nanoverl"]

[project.entry-points.nanoverl]
nanoverl-legacy-loss = "nanoverl_legacy_loss.plugin"

[tool.setuptools.packages.find]
where = ["src"]
""",
    "src/nanoverl_legacy_loss/__init__.py": "",
    "src/nanoverl_legacy_loss/plugin.py": """from nanoverl_core import hookimpl


@hookimpl
def register_policy_losses(register):
    register("legacy_pg", "nanoverl_legacy_loss.loss:legacy_pg", description="written to the 0.1.0 guide")
""",
    # the 0.1.0 guide: inputs held `response_mask` (the tokens that count)
    "src/nanoverl_legacy_loss/loss.py": """def legacy_pg(inputs, config):
    token_losses = -inputs.advantages * inputs.log_prob * inputs.response_mask
    return inputs.aggregate(token_losses), {"actor/pg_loss": inputs.token_mean(token_losses)}
""",
}


def test_a_loss_plugin_written_for_0_1_0_stops_with_one_error_line(tmp_path):
    for path, body in LEGACY_LOSS.items():
        (tmp_path / "pkg" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / path).write_text(body)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", "--target", str(tmp_path / "site"), str(tmp_path / "pkg")],
                   check=True, capture_output=True, text=True)
    proc = run_cli("--config", str(EXAMPLES / "debug_reinforce.toml"), "trainer.progress=none", "trainer.total_steps=2",
                   "trainer.val_every=0", "actor.policy_loss=legacy_pg", f"trainer.output_dir={tmp_path / 'run'}",
                   env=cli_env(PYTHONPATH=str(tmp_path / "site")))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    named = [line for line in proc.stderr.splitlines() if "response_mask" in line]
    assert len(errors) == 1 and named == errors, proc.stderr[-2000:]
    assert errors[0].startswith("error: PolicyLossInputs.response_mask was removed in nanoverl 0.4.0: use loss_mask")
    assert "CHANGELOG.md" in errors[0]


def test_the_reward_scorers_0_2_0_entry_points_are_one_line_naming_score_batch():
    """RewardScorer.score, score_components and score_responses (deprecated in 0.3.0) are gone: calling one is
    a PluginError naming score_batch and score_texts; score_texts scores plain texts."""
    from nanoverl_core import RLBatch, load_registry
    from nanoverl_core.config import RewardConfig
    from nanoverl_core.reward import RewardScorer
    from nanoverl_core.testing import score_texts

    scorer = RewardScorer(RewardConfig(name="char_match", workers=0), load_registry())
    batch = RLBatch(non_tensors={"prompt_text": ["p", "q"], "row": [{"target": "ab"}, {"target": "cd"}],
                                 "index": [0, 1]})
    scores, metrics = score_texts(scorer, batch, ["ab", "cx"])
    assert scores.tolist() == [1.0, 0.5] and metrics["reward/errors"] == 0
    for name in ("score", "score_components", "score_responses"):
        with pytest.raises(PluginError) as raised:
            getattr(scorer, name)(batch, ["ab", "cx"])
        line = str(raised.value)
        assert line.startswith(f"RewardScorer.{name} was removed in nanoverl 0.4.0: ") and "\n" not in line
        assert "score_batch(batch, tokenizer, step, phase=...)" in line
        assert "nanoverl_core.testing.score_texts" in line
    with pytest.raises(AttributeError):
        scorer.scores                                             # other missing names stay AttributeErrors


def test_a_rollout_written_for_0_1_0_is_one_line_naming_the_new_column():
    out = responses_to_batch([[3, 1], [3, 3]], eos_token_id=1, pad_token_id=0, max_new_tokens=4)
    assert check_rollout_columns(out, "mine") is out
    out["loss_mask"] = out["response_mask"]
    with pytest.raises(PluginError, match="rollout.name = 'mine' returned a 'loss_mask' column.*'model_mask'"):
        check_rollout_columns(out, "mine")
    out.pop("loss_mask")
    out.pop("truncated")
    with pytest.raises(PluginError, match="returned no 'truncated' column.*responses_to_batch"):
        check_rollout_columns(out, "mine")


def test_an_actor_written_for_0_1_0_is_one_line_naming_the_new_signature():
    class OldActor:
        def update(self, batch, *, on_policy=False):
            return {}

    class NewActor:
        def update(self, batch, policy_loss, *, on_policy=False):
            return {}

    class Actor030:                                                # the keyword it accepted is never passed
        def update(self, batch, policy_loss, *, on_policy=False, keep_log_probs=False):
            return {}

    check_actor_update(NewActor(), "mine")
    check_actor_update(Actor030(), "mine")
    with pytest.raises(PluginError, match=r"worker.name = 'mine'.*update\(batch, policy_loss, \*, on_policy\)"):
        check_actor_update(OldActor(), "mine")


def test_a_deprecated_name_in_use_is_one_warning_line(capsys):
    """The other half of the contract, for the next rename: nanoverl-train shows a NanoverlDeprecation as one
    `warning:` line (none is pending in this version)."""
    from nanoverl_core.cli import _show_warning

    _show_warning(NanoverlDeprecation("X.old is deprecated since nanoverl 0.4.0: use new (CHANGELOG.md)"),
                  NanoverlDeprecation, "plugin.py", 3)
    err = capsys.readouterr().err
    assert err == "warning: X.old is deprecated since nanoverl 0.4.0: use new (CHANGELOG.md) (at plugin.py:3)\n"
