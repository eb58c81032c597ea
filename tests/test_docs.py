"""The docs stay true and in one place: the README orients (<= 340 lines), every list a README gives of
what a plugin registers equals what it registers, the nox sessions, the example-plugin count and the core's
size match the code, no table row lives in two files, and no user-facing page speaks of how it was made
(dates, commits, aims, machine load, CI run times) or names a processor outside the one table of the
machines measured: a figure names the instruction set and the cores. Plain file reading; no model, no nox,
no plugin install.
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
         "register_data_sources": "data source", "register_agents": "agent"}
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
    assert lines <= 340, f"README.md has {lines} lines; move reference material to docs/"


def test_the_readmes_core_size_is_what_its_command_counts():
    """The README says how many lines the core is and gives the command that counts them: the two agree
    (to 3%: "about")."""
    text = " ".join(README.read_text().split())
    match = re.search(r"is about ([\d,]+) lines of Python \(`find nanoverl_core -name '\*\.py' \| xargs cat \| wc -l`\)", text)
    assert match, "README.md no longer states the core's size with its command"
    stated = int(match.group(1).replace(",", ""))
    counted = sum(len(p.read_text().splitlines()) for p in (ROOT / "nanoverl_core").rglob("*.py"))
    assert abs(stated - counted) <= 0.03 * counted, f"README.md says about {stated:,} lines; the command counts {counted:,}"


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
    found = [(pattern, text[max(0, m.start() - 40):m.end() + 40]) for pattern in BUILDER_NOTES + HOW_MADE + DATES
             for m in re.finditer(pattern, text, re.IGNORECASE)]
    assert not found, found


MACHINES = ROOT / "benchmarks" / "README.md"
"""The page whose "Machines measured" table is the one place a processor is named."""
PROCESSORS = r"\b(?:Xeon|EPYC|Ryzen|Threadripper|Opteron|Graviton|Neoverse|Ampere Altra|Intel|AMD|Core i[3579]|Apple M[1-9])\b"
"""Processor vendors and families: a figure names the instruction set and the cores instead ("2 cores, AVX2")."""
HOW_MADE = [r"\bon this CPU\b", r"\bthe same (?:machine|CPU|host|Xeon|EPYC)\b", r"\bin (?:two|three|four|\d+) sessions\b",
            r"\b(?:an? )?(?:idle|busy|quiet|loaded) (?:machine|host)\b", r"\bover the (?:CPUs|machines) measured\b",
            r"\b(?:measured|ran|run) (?:again )?(?:right after|before) (?:them|it)\b", r"\bmeasured again\b",
            r"\bshared with other jobs\b", r"\bnot in CI\b", r"\bCI(?:'s)? (?:took|takes|run time|timings?)\b"]
"""How a figure was taken (the machine's load, the order of runs, which machine it shared), not what it is."""
DATES = [r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December) (?:\d{1,2}, )?20\d\d\b",
         r"\b\d{1,2} (?:January|February|March|April|May|June|July|August|September|October|November|December) 20\d\d\b"]


def machines_table(text: str) -> list[str]:
    """The body rows of the table under "## Machines measured" (the one place a processor is named)."""
    section = text.split("\n## Machines measured\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")][1:]


def test_one_table_lists_the_machines_figures_were_measured_on():
    rows = machines_table(MACHINES.read_text())
    assert rows and all(re.search(PROCESSORS, row) for row in rows), rows
    labels = {row.strip("|").split("|")[0].strip() for row in rows}
    named = {m.group(1) for f in USER_FILES for m in re.finditer(r"\b2 cores(?:,| with) (AVX[\w-]+)", f.read_text())}
    assert named and named <= labels, f"figures name {sorted(named - labels)}, which the table does not list"


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_processor_is_named_outside_the_table_of_machines_measured(path):
    text = path.read_text()
    allowed = set(machines_table(text)) if path == MACHINES else set()
    found = [line.strip()[:160] for line in text.splitlines() if re.search(PROCESSORS, line) and line not in allowed]
    assert not found, (f"{path.relative_to(ROOT)} names a processor; say the instruction set and the cores "
                       f"(\"2 cores, AVX2\"), and list the machine in benchmarks/README.md's table", found)
