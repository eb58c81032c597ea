"""The verdict of assert tests (HumanEval, MBPP) is the tests' alone: the program supplies only the names the row
asks for, its exceptions arrive as the checker's own kind, its values cross as plain data (jail/checker.py,
jail/wire.py). Each rule is pinned here by a program that attacks it, and all of HumanEval is checked both ways:
every canonical solution passes, and no program that shadows the names its tests use passes any row."""

from __future__ import annotations

import builtins
import json
import math
import symtable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nanoverl_code.jail.checker import program_names
from nanoverl_code.jail.wire import MAX_DEPTH, Uncarried, decode, encode
from nanoverl_code.rewards import score_row
from nanoverl_code.settings import CodeSettings

REPO = Path(__file__).resolve().parents[3]
HUMANEVAL = [json.loads(line) for line in (REPO / "examples/data/humaneval/test.jsonl").read_text().splitlines()]
SETTINGS = CodeSettings(code_from="response", score="fraction", cpu_s=2, wall_s=5)
RIGHT_F = "def f(x):\n    return [3 * v for v in x] if isinstance(x, list) else 3 * x\n"
"""The right answer of the rows below: three times a number, or each number of a list."""


def verdicts(program: str, row: dict) -> list[str]:
    return score_row(program, row, SETTINGS)[1]


# ---- the names the program supplies ------------------------------------------------------------------------
def test_program_names_are_the_free_names_of_the_test_that_nothing_else_binds():
    assert program_names("assert add(2, 3) == 5", set()) == ["add"]
    assert program_names("assert abs(f(1) - g(2)) < 1e-9 and sorted(h([1])) == [1]", set()) == ["f", "g", "h"]
    assert program_names("import math\nassert math.isclose(half(3), 1.5)", set()) == ["half"]
    assert program_names("assert helper(f(1)) == 2", {"helper"}) == ["f"]            # bound by the setup
    assert program_names("def check(candidate):\n    assert candidate(1) == poly(1)\n", {"poly", "incr"},
                         entry="incr") == ["incr"]                                   # HumanEval: the entry point
    assert program_names("X = [1, 2]\nassert all(f(x) for x in X)", set()) == ["f"]  # the test's own X, x
    assert program_names("def check(c):\n    global seen\n    seen = c(1)\n", set()) == []
    assert program_names("from math import *\nassert sqrt(f(4)) == 2", set()) == ["f"]  # a star import's names


def test_a_builtin_named_by_the_row_as_its_entry_point_is_the_programs():
    """A row may ask for a function called like a builtin; only the row's own name makes it the program's."""
    assert program_names("def check(candidate):\n    assert candidate([2, 1]) == [1, 2]\n", set(),
                         entry="sorted") == ["sorted"]
    assert "sorted" not in program_names("assert sorted(f([2, 1])) == [1, 2]", set())
    row = {"test_list": ["assert sum([1, 2]) == 6"]}                     # MBPP: the row's entry_point
    doubled = "def sum(xs):\n    total = 0\n    for x in xs:\n        total += 2 * x\n    return total\n"
    assert verdicts(doubled, row) == ["wrong_answer"] and verdicts(doubled, {**row, "entry_point": "sum"}) == ["pass"]


SHADOWED = [  # (the builtin, an assert the right answer passes, the constant a shadow and the wrong f return)
    ("abs", "assert abs(f(3) - 9) < 1e-9", "0"), ("round", "assert round(f(3)) == round(9)", "0"),
    ("int", "assert int(f(3)) == int(9)", "0"), ("float", "assert float(f(3)) == float(9)", "0"),
    ("str", "assert str(f(3)) == str(9)", "0"), ("repr", "assert repr(f(3)) == repr(9)", "0"),
    ("bool", "assert bool(f(3)) == bool(9)", "0"), ("hash", "assert hash(f(3)) == hash(9)", "0"),
    ("hex", "assert hex(f(3)) == hex(9)", "0"), ("sorted", "assert sorted(f([3, 1])) == sorted([9, 3])", "0"),
    ("set", "assert set(f([3, 1])) == set([3, 9])", "0"), ("frozenset", "assert frozenset(f([1])) == frozenset([3])", "0"),
    ("tuple", "assert tuple(f([3])) == tuple([9])", "0"), ("list", "assert list(f([3])) == list([9])", "0"),
    ("len", "assert len(f([1, 2])) == len([3, 6]) == 2", "2"), ("sum", "assert sum(f([1, 2])) == sum([3, 6])", "0"),
    ("max", "assert max(f([1, 2])) == max([3, 6])", "0"), ("min", "assert min(f([1, 2])) == min([3, 6])", "0"),
    ("all", "assert all(a == b for a, b in zip(f([1, 2]), [3, 6]))", "True"),
    ("any", "assert not any(a != b for a, b in zip(f([1, 2]), [3, 6]))", "False"),
    ("isinstance", "assert isinstance(f('a'), str)", "True"), ("type", "assert type(f('a')) is type('')", "0"),
    ("range", "assert f([1, 2]) == list(range(3, 9, 3))", "[]"), ("zip", "assert list(zip(f([1]))) == [(3,)]", "[]"),
    ("map", "assert list(map(str, f([1, 2]))) == ['3', '6']", "[]"),
    ("getattr", "assert getattr(f(3), 'real') == 9", "0"), ("divmod", "assert divmod(f(7), 5) == (4, 1)", "0"),
    ("ord", "assert ord(f('a')[0]) == 97", "0"), ("print", "assert print(f(3)) is None and f(3) == 9", "None"),
]


@pytest.mark.parametrize("name, test, constant", SHADOWED, ids=[case[0] for case in SHADOWED])
def test_a_builtin_the_tests_use_stays_the_checkers_whatever_the_program_defines(name, test, constant):
    row = {"test_list": [test]}
    assert verdicts(RIGHT_F, row) == ["pass"]
    wrong = f"def f(*a, **k):\n    return {constant}\ndef {name}(*a, **k):\n    return {constant}\n"
    assert verdicts(wrong, row) != ["pass"]


def test_a_shadowed_builtin_is_never_handed_the_tests_values():
    program = "import sys\ndef f(x):\n    return 0\ndef abs(*a):\n    print('SHADOW', a, file=sys.stderr)\n    return 0\n"
    score, kinds, outcomes = score_row(program, {"test_list": ["assert abs(f(3) - 31337) < 1e-9"]}, SETTINGS)
    assert kinds == ["wrong_answer"] and "SHADOW" not in outcomes[0].stderr


def test_names_the_setup_binds_stay_the_checkers():
    """MBPP's test_setup_code and test_imports, and a HumanEval prompt's helper, are the checker's own."""
    row = {"test_list": ["assert math.isclose(f(3), ref(3))"], "test_imports": ["import math"],
           "test_setup_code": "def ref(x):\n    return 3 * x"}
    assert verdicts(RIGHT_F, row) == ["pass"]
    fake = "import types\nmath = types.SimpleNamespace(isclose=lambda *a, **k: True)\n" \
           "def ref(x):\n    return 0\ndef f(x):\n    return 0\n"
    assert verdicts(fake, row) == ["wrong_answer"]
    poly = next(r for r in HUMANEVAL if r["extra_info"]["task_id"] == "HumanEval/32")  # check uses the prompt's poly
    cheat = "def poly(*a, **k):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"
    assert score_row(cheat, poly, SETTINGS)[1] == ["wrong_answer"]


CONTROL_FLOW = ["StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit",
                "AssertionError", "RecursionError", "Exception"]
FORMS = ["assert all(map(f, [1, 2, 3]))", "assert max(map(f, [1, 2]), default=6) == 6",
         "assert not list(filter(lambda v: v != 3 * 1, map(f, [1])))",
         "try:\n    assert f(1) == 3\nexcept ValueError:\n    pass"]


@pytest.mark.parametrize("exception", CONTROL_FLOW)
def test_an_exception_the_program_raises_arrives_as_the_checkers_own_kind(exception):
    """`StopIteration` from the function would end map() early, and all() of nothing is True: the program's
    exception reaches the tests only as ProgramRaised (a plain Exception), and the case fails."""
    row = {"test_list": FORMS}
    assert verdicts(RIGHT_F, row) == ["pass"] * len(FORMS)
    raising = f"def f(*a, **k):\n    raise {exception}('from the program')\n"
    assert "pass" not in verdicts(raising, row)


def test_a_bare_except_in_the_test_does_not_hide_a_call_that_failed():
    """A call whose program is gone, or whose value is not plain data, decides the verdict whatever the test's
    own flow does after it."""
    row = {"test_list": ["try:\n    assert f(1) == 3\nexcept:\n    pass"]}
    assert verdicts(RIGHT_F, row) == ["pass"]
    assert verdicts("import os\ndef f(x):\n    os._exit(0)\n", row) == ["runtime_error"]
    assert verdicts("def f(x):\n    return object()\n", row) == ["wrong_answer"]
    assert verdicts("def f(x):\n    return (lambda: 0)\n", {"test_list": ["assert f(1) == 3"]}) == ["wrong_answer"]


# ---- values cross as data -------------------------------------------------------------------------------------
def test_decode_turns_anything_malformed_into_uncarried():
    assert decode(encode({"a": (1, 2.5, "x"), 3: {1, 2}, "b": b"\x00\xff", "c": 1 + 2j})) == \
        {"a": (1, 2.5, "x"), 3: {1, 2}, "b": b"\x00\xff", "c": 1 + 2j}
    assert math.isnan(decode(float("nan")))
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    bad = [deep, {"__set__": [[1]]}, {"__bytes__": "zz"}, {"__complex__": [1]}, {"__dict__": [[[1], 2]]},
           {"__tuple__": "ab"}, {"__frozenset__": 5}, {"__dict__": [[1]]}, object()]
    for data in bad:
        with pytest.raises(Uncarried):
            decode(data)
    with pytest.raises(Uncarried):
        encode(deep)


# ---- HumanEval, both ways ---------------------------------------------------------------------------------------
def _each_row(fn) -> list:
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, HUMANEVAL))


def test_every_canonical_humaneval_solution_passes():
    """Where nanoverl differs from HumanEval's harness (one namespace for solution and tests there), no row
    whose reference passes there fails here."""
    settings = CodeSettings(code_from="response")
    failed = [r["extra_info"]["task_id"] for r, (score, _, _) in
              zip(HUMANEVAL, _each_row(lambda r: score_row(r["extra_info"]["canonical_solution"], r, settings)))
              if score["score"] != 1.0]
    assert len(HUMANEVAL) == 164 and failed == []


def _used_builtins(code: str) -> list[str]:
    names, tables = set(), [symtable.symtable(code, "test.py", "exec")]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        names |= {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    return sorted(n for n in names if n in dir(builtins) and not n.startswith("__"))


def shadowing_programs(row: dict) -> list[str]:
    """Wrong programs that define every builtin the row's tests use as a constant (the constants that passed
    6 of the 164 rows when the program's names reached the tests), and one that raises StopIteration."""
    entry, shadow = row["extra_info"]["entry_point"], _used_builtins(row["extra_info"]["test"])
    programs = [f"def {entry}(*a, **k):\n    return {c}\n" +
                "".join(f"def {b}(*a, **k):\n    return {c}\n" for b in shadow) for c in ("0", "True", "[]")]
    return [*programs, f"def {entry}(*a, **k):\n    raise StopIteration\n"]


def test_no_humaneval_row_passes_a_program_that_shadows_the_names_its_tests_use():
    settings = CodeSettings(code_from="response")
    scores = _each_row(lambda r: [score_row(p, r, settings)[0]["score"] for p in shadowing_programs(r)])
    passed = [r["extra_info"]["task_id"] for r, s in zip(HUMANEVAL, scores) if any(s)]
    assert passed == []
