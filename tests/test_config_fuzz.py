"""The error contract, fuzzed: whatever a user types, `nanoverl-train` exits 0, or exits 2 with exactly one
`error:` line and leaves nothing under trainer.output_dir; never a traceback.

Values are drawn from the schema itself (every key of every section and of every registered component's
settings table) and from a list of the wrong things users write (wrong types, NaN, +-inf, 0, negatives,
huge numbers, empty strings and lists, paths of every wrong kind, unknown keys at every depth); command
lines put the options and overrides in any order. Each test calls the CLI's `main` in this process (a
traceback is an exception that escapes it), through the same code path as the console script.

Profiles (hypothesis settings): "ci", the default, derandomized (a fixed seed) with a budget that takes
about a minute here (2 cores); "long" for local runs, `NANOVERL_FUZZ=long pytest tests/test_config_fuzz.py`
(20x the examples, random seeds; run it before a release). A hole found becomes a named regression
test in test_reliability_inputs.py (docs/faults.md lists them).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import typing
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES
from nanoverl_core.cli import main
from nanoverl_core.config import COMPONENTS, Config
from nanoverl_core.config.structure import user_fields
from nanoverl_core.plugins import load_registry

settings.register_profile("ci", max_examples=150, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PROFILE = os.environ.get("NANOVERL_FUZZ", "ci")
REINFORCE = str(EXAMPLES / "debug_reinforce.toml")
SCALE = {"ci": 1, "long": 20}[PROFILE]


def schema_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key a user can write in the core config (sections recursed, component tables aside)."""
    keys = []
    for name, field in user_fields(cls).items():
        if isinstance(field.type, type) and attrs.has(field.type):
            keys += schema_keys(field.type, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def component_keys() -> list[tuple[str, str]]:
    """(override that selects the component, a key of its settings table) for every registered component
    with settings: `[rollout.vllm] gpu_memory_utilization` is fuzzed with rollout.name=vllm."""
    registry, out = load_registry(), []
    for section, kind in COMPONENTS.items():
        select = {"actor": "actor.policy_loss", "algorithm": "algorithm.advantage_estimator",
                  "tracking": "tracking.trackers"}.get(section, f"{section}.name")
        for name in registry.names(kind):
            cls = registry.settings_class(kind, name)
            if cls is None:
                continue
            selector = f"{select}=[console,{name}]" if section == "tracking" else f"{select}={name}"
            out += [(selector, f"{section}.{name}.{key}") for key in user_fields(cls)]
    return out


KEYS = schema_keys()
COMPONENT_KEYS = component_keys()
SECTIONS = sorted({key.rsplit(".", 1)[0] for key in KEYS} | {key for key in user_fields(Config)})

WRONG_TEXT = ["nan", "inf", "-inf", "0", "-1", "-0.5", "1e30", "123456789012345678901234567890", "-1e308",
              "", "[]", "{}", "[1, 2]", "[[]]", "abc", "true", "false", "1.5", "null", "~", "'quoted'", '"x"',
              "{a: 1}", "[a, b]", "2**32", "0x10", "1_000", " ", "\\n", "é", "/", ".", "..",
              "/nonexistent/file.py", "/dev/null", "/proc/self", "examples", "examples/data/debug_copy/train.jsonl",
              "README.md", "noxfile.py", "runs"]
"""What users write where it does not belong (paths relative to the repository root, where tests run)."""

values = st.one_of(st.sampled_from(WRONG_TEXT), st.text(max_size=6), st.integers().map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))
unknown_keys = st.builds(lambda section, name: f"{section}.{name}", st.sampled_from(SECTIONS),
                         st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
override = st.one_of(
    st.builds(lambda k, v: [f"{k}={v}"], st.sampled_from(KEYS), values),
    st.builds(lambda kk, v: [kk[0], f"{kk[1]}={v}"], st.sampled_from(COMPONENT_KEYS), values),
    st.builds(lambda k, v: [f"{k}={v}"], unknown_keys, values),
    st.sampled_from([["=1"], ["trainer"], ["trainer.="], ["..=3"], ["trainer.total_steps"], ["-x"], ["--dry"],
                     ["trainer.total_steps==3"], ["trainer.seed.x=1"], ["trainer=3"]]),
)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """`nanoverl-train ARGV` in this process: (exit status, stdout, stderr). A traceback escapes as an
    exception."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's --help
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def assert_contract(rc: int, stderr: str, run_dir: Path) -> None:
    assert rc in (0, 2), (rc, stderr[-2000:])
    if rc == 2:
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, stderr[-2000:]
        assert not run_dir.exists() or not any(run_dir.iterdir()), (stderr, sorted(run_dir.rglob("*")))


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    monkeypatch.chdir(EXAMPLES.parents[1])


@settings(settings.get_profile(PROFILE), max_examples=200 * SCALE)
@given(overrides=st.lists(override, min_size=1, max_size=3), order=st.randoms(use_true_random=False),
       with_config=st.booleans())
def test_any_dry_run_command_line_keeps_the_contract(tmp_path, overrides, order, with_config):
    run_dir = tmp_path / "fuzz-run"
    units = [[f"trainer.output_dir={run_dir}"], ["--dry-run"], *overrides]
    if with_config:
        units.append(["--config", REINFORCE])
    order.shuffle(units)
    rc, stdout, stderr = run_main([token for unit in units for token in unit])
    assert_contract(rc, stderr, run_dir)
    if rc == 0:  # accepted means valid: no NaN or inf reached the resolved config (a NaN lr once trained)
        json.loads(stdout, parse_constant=lambda name: pytest.fail(f"{name} in the resolved config: {units}"))


@settings(settings.get_profile(PROFILE), max_examples=40 * SCALE)
@given(sub=st.sampled_from(["plugins", "eval", "export", "score", "translate"]),
       extra=st.lists(st.sampled_from(["--json", "--config", REINFORCE, "--checkpoint", "step_3", "x=1",
                                       "--dry-run", "runs", "/nonexistent", "trainer.total_steps=0", "--responses",
                                       "--toml", "--", "data.train_batch_size=8"]), max_size=4))
def test_sub_commands_with_any_arguments_keep_the_contract(tmp_path, sub, extra):
    run_dir = tmp_path / "fuzz-run"
    if sub == "eval":  # eval runs the model: keep it on the cheap debug config with a tiny validation set
        extra = [*extra, f"trainer.output_dir={run_dir}", "data.val_batch_size=4"]
    if sub == "export":
        extra = [a for a in extra if not a.startswith("/")] + [str(run_dir)]
    rc, _, stderr = run_main([sub, *extra])
    assert rc in (0, 2), (rc, stderr[-2000:])
    if rc == 2:
        assert len([line for line in stderr.splitlines() if line.startswith("error:")]) == 1, stderr


# ---- data files: a real one-step run on the debug backends ----------------------------------------------
def _rows(n: int, **extra) -> str:
    return "".join(json.dumps({"prompt": f"copy {i}", "answer": f"{i}", **extra}) + "\n" for i in range(n))


DATA_FILES = {
    "empty.jsonl": "",
    "blank_lines.jsonl": "\n\n",
    "no_prompt_key.jsonl": "".join(json.dumps({"question": "q", "answer": "a"}) + "\n" for _ in range(8)),
    "prompt_is_a_number.jsonl": "".join(json.dumps({"prompt": 7, "answer": "a"}) + "\n" for _ in range(8)),
    "prompt_is_null.jsonl": "".join(json.dumps({"prompt": None, "answer": "a"}) + "\n" for _ in range(8)),
    "prompt_is_a_dict.jsonl": "".join(json.dumps({"prompt": {"a": 1}, "answer": "a"}) + "\n" for _ in range(8)),
    "chat_without_content.jsonl": "".join(json.dumps({"prompt": [{"role": "user"}], "answer": "a"}) + "\n"
                                          for _ in range(8)),
    "too_long.jsonl": _rows(8).replace("copy", "copy " * 400),
    "half_a_row.jsonl": _rows(8) + '{"prompt": "cut sh',
    "not_json.jsonl": "prompt,answer\ncopy 1,1\n",
    "a_list.json": json.dumps([1, 2, 3]),
    "truncated.parquet": None,   # the first half of a real parquet file
    "text_as.parquet": "not parquet at all",
    "too_few_rows.jsonl": _rows(1),
    "mixed_types.jsonl": _rows(4) + "".join(json.dumps({"prompt": ["x"], "answer": 1}) + "\n" for _ in range(4)),
}


def _write_data(folder: Path, name: str) -> Path:
    path = folder / name
    if DATA_FILES[name] is None:
        whole = (EXAMPLES.parents[1] / "examples" / "data" / "gsm8k" / "test.parquet").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    else:
        path.write_text(DATA_FILES[name])
    return path


@settings(settings.get_profile(PROFILE), max_examples=len(DATA_FILES) * SCALE)
@given(train=st.sampled_from(sorted(DATA_FILES)), val=st.sampled_from([None, *sorted(DATA_FILES)]))
def test_bad_data_files_exit_2_and_leave_no_run_directory(tmp_path_factory, train, val):
    folder = tmp_path_factory.mktemp("data")
    run_dir = folder / "run"
    val_files = f"[{_write_data(folder, val)}]" if val else "[]"
    rc, _, stderr = run_main(["--config", REINFORCE, f"trainer.output_dir={run_dir}", "trainer.progress=none",
                           "trainer.total_steps=1", "trainer.save_every=0", "data.batch_size=4", "rollout.n=2",
                           f"data.train_files=[{_write_data(folder, train)}]", f"data.val_files={val_files}",
                           "tracking.trackers=[jsonl]", "data.max_prompt_length=64"])
    assert_contract(rc, stderr, run_dir)
    assert rc == 2, "every drawn data file has something wrong with it"


def test_the_schema_walk_sees_every_section_and_component_table():
    """The fuzzer draws what the schema declares: a key missing here would never be fuzzed."""
    assert {"trainer.total_steps", "actor.lr", "algorithm.rollout_correction.is_threshold", "model.lora.rank",
            "environment.max_turns"} <= set(KEYS)
    tables = {key.rsplit(".", 1)[0] for _, key in COMPONENT_KEYS}
    assert {"rollout.debug", "actor.cispo", "tracking.plot"} <= tables, tables
    assert typing.get_type_hints(Config)  # the schema resolves (no string annotation left unresolvable)


def test_every_number_of_the_core_and_the_first_party_plugins_declares_its_domain():
    """Every int / float key, of the core's sections and of every first-party component's settings table,
    carries a domain (config/domains.py), so NaN, inf and out-of-range values are refused at the key."""
    from conftest import first_party_registry
    from nanoverl_core.config.domains import domain_of

    def numbers(cls: type, prefix: str) -> list[tuple[str, attrs.Attribute]]:
        out, hints = [], typing.get_type_hints(cls)
        for name, field in user_fields(cls).items():
            ftype = hints.get(name, field.type)
            (item,) = typing.get_args(ftype) if typing.get_origin(ftype) is list else (None,)
            if isinstance(ftype, type) and attrs.has(ftype):
                out += numbers(ftype, f"{prefix}{name}.")
            elif isinstance(item, type) and attrs.has(item):          # [[reward.components]], a source's tasks
                out += numbers(item, f"{prefix}{name}[].")
            elif typing.get_origin(ftype) is not list and ftype is not bool and \
                    set(typing.get_args(ftype) or (ftype,)) - {type(None)} <= {int, float}:
                out.append((f"{prefix}{name}", field))
        return out

    fields = numbers(Config, "")
    registry = first_party_registry()
    for section, kind in COMPONENTS.items():
        for name in registry.names(kind):
            cls = registry.settings_class(kind, name)
            if cls is not None and registry.entry(kind, name).provider.startswith("nanoverl"):
                fields += numbers(cls, f"{section}.{name}.")
    assert len(fields) > 80
    undeclared = [key for key, field in fields if domain_of(field) is None]
    assert not undeclared, f"numbers without a declared domain: {undeclared}"
