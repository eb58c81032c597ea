"""The docs stay true and in one place: the README orients (<= 320 lines), every list a README gives of
what a plugin registers equals what it registers, the nox sessions and the example-plugin count match the
code, no table row lives in two files, and no user-facing page speaks of how it was made (dates, commits,
aims, machine load, CI run times). Plain file reading; no model, no nox, no plugin install.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TABLE_FILES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
"""The files a reference table may live in, each table in one of them only."""
USER_FILES = [*TABLE_FILES, *sorted((ROOT / "plugins").glob("*/README.md")),
              *sorted((ROOT / "examples").rglob("README.md"))]
"""Every page a user reads."""
PLUGINS = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "README.md").is_file())
KINDS = {"register_rollouts": "rollout", "register_workers": "worker", "register_rewards": "reward",
         "register_trackers": "tracker", "register_advantage_estimators": "advantage estimator",
         "register_policy_losses": "policy loss", "register_environments": "environment",
         "register_data_sources": "data source"}
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10}


def registered(plugin_dir: Path) -> set[tuple[str, str]]:
    """(kind, name) of everything a plugin's hooks register: its plugin.py loaded from this checkout and
    each hook called with a collecting `register` (a plugin.py holds lazy strings only, so this is cheap)."""
    (path,) = plugin_dir.glob("src/*/plugin.py")
    spec = importlib.util.spec_from_file_location(f"_docs_check_{plugin_dir.name.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names: set[tuple[str, str]] = set()
    for hook, kind in KINDS.items():
        if hasattr(module, hook):
            getattr(module, hook)(lambda name, obj, *, kind=kind, **_: names.add((kind, name)))
    return names


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table body row (header and separator rows left out)."""
    lines = text.splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or re.fullmatch(r"[|\-: ]+", line.strip()):
            continue
        if i + 1 < len(lines) and re.fullmatch(r"\|[-: |]+\|?", lines[i + 1].strip()):
            continue  # a header row
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_the_readme_orients_in_about_300_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= 320, f"README.md has {lines} lines; move reference material to docs/"


def test_the_grpo_readme_lists_exactly_the_estimators_the_plugin_registers():
    plugin = ROOT / "plugins" / "nanoverl-grpo"
    want = {name for kind, name in registered(plugin) if kind == "advantage estimator"}
    listed = {m.group(1) for row in table_rows((plugin / "README.md").read_text())
              if (m := re.fullmatch(r"`(\w+)`", row[0]))}
    assert listed == want, f"README lists {sorted(listed)}, plugin.py registers {sorted(want)}"


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_each_plugin_readme_lists_exactly_the_rewards_the_plugin_registers(plugin):
    text = (plugin / "README.md").read_text()
    want = {name for kind, name in registered(plugin) if kind == "reward"}
    listed = {m.group(1) for row in table_rows(text) if row[0] == "reward" and (m := re.fullmatch(r"`(\w+)`", row[1]))}
    listed |= set(re.findall(r"\bthe reward `(\w+)`", text))
    assert listed == want, f"{plugin.name}/README.md lists rewards {sorted(listed)}, plugin.py registers {sorted(want)}"


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_a_plugin_readmes_kind_table_names_everything_the_plugin_registers(plugin):
    rows = [r for r in table_rows((plugin / "README.md").read_text()) if len(r) >= 2 and r[0] in KINDS.values()]
    if not rows:
        pytest.skip("no `| kind | name |` table")
    listed = {(r[0], m.group(1)) for r in rows if (m := re.fullmatch(r"`(\w+)`", r[1]))}
    assert listed == registered(plugin)


def nox_sessions() -> set[str]:
    """What `nox -l` lists: every function of noxfile.py decorated with @nox.session (its name= if given)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            target = call.func if call else deco
            if ast.unparse(target) == "nox.session":
                named = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                sessions.add(named[0] if named else node.name)
    return sessions


def test_the_sessions_the_docs_list_are_noxs_sessions():
    paragraphs = [p for f in USER_FILES for p in f.read_text().split("\n\n") if "`nox -l`" in p]
    assert paragraphs, "no page lists the nox sessions next to `nox -l`"
    sessions = nox_sessions()
    for paragraph in paragraphs:
        listed = {w for w in re.findall(r"`([a-z_]+)`", paragraph) if w != "nox"}
        assert listed == sessions, f"listed {sorted(listed)}, noxfile.py has {sorted(sessions)}"


def test_every_count_of_the_example_plugins_is_the_number_of_folders():
    folders = [p for p in (ROOT / "examples" / "plugins").iterdir() if (p / "pyproject.toml").is_file()]
    pattern = re.compile(r"\b(one|two|three|four|five|six|seven|eight|nine|ten)\b(?!-)(?=[^.:;(]{0,60}?"
                         r"(?:example(?: third-party)? plugins|pip-installable nanoverl plugins|examples/plugins))",
                         re.IGNORECASE)
    counts = [(f.relative_to(ROOT), m.group(0)) for f in USER_FILES for m in pattern.finditer(f.read_text())]
    assert counts, "no page states how many example plugins there are"
    wrong = [(str(f), word) for f, word in counts if NUMBERS[word.lower()] != len(folders)]
    assert not wrong, f"{len(folders)} example plugins under examples/plugins/, but: {wrong}"


def test_no_table_row_appears_in_two_files():
    where = defaultdict(set)
    for f in TABLE_FILES:
        for row in table_rows(f.read_text()):
            where["| " + " | ".join(row) + " |"].add(str(f.relative_to(ROOT)))
    twice = {row[:100]: sorted(files) for row, files in where.items() if len(files) > 1}
    assert not twice, f"a table has one home; these rows are in two files: {twice}"


BUILDER_NOTES = [r"not re-measured", r"the aim was", r"shared the cores", r"CI's last", r"\b[0-9a-f]{40}\b",
                 r"\b20[2-9]\d-[01]\d", r"load average", r"this project's (?:AVX|CPU|machine)", r"a few thousand lines"]
"""Phrases about how the docs were made (dates, commits, aims, machine load, CI run times), not what the
software does."""


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_user_facing_page_holds_a_builders_note(path):
    text = path.read_text()
    found = [(pattern, text[max(0, m.start() - 40):m.end() + 40]) for pattern in BUILDER_NOTES
             for m in re.finditer(pattern, text, re.IGNORECASE)]
    assert not found, found
