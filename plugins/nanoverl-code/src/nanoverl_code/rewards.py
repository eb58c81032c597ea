"""The `code` reward: the response's program run against the row's test cases in the sandbox (sandbox.py).

    [reward]
    name = "code"

    [reward.code]                   # all optional (nanoverl_code/settings.py)
    sandbox = "namespaces"          # or "rlimits" where namespaces cannot be made
    code_from = "last_block"        # or "response"
    score = "all"                   # or "fraction"
    cpu_s = 2.0                     # and wall_s, memory_mb, max_output_bytes, processes, ...

Where the test cases are (the first layout that is present), in the row, its `extra_info`, or a ground
truth that is a dict (or a JSON object in a string):

    stdin/stdout  {"inputs": [...], "outputs": [...]}: verl's prime_code / APPS / TACO / CodeContests rows,
                  test cases in reward_model.ground_truth as a JSON string or a dict; an input or output
                  that is a list of lines is joined with newlines
    call-based    the same with "fn_name": inputs[i] is the argument list, outputs[i] the return value
                  (or [return value], as APPS writes it); a top-level function or a method of class Solution
    HumanEval     "test" (defining check(candidate)) and "entry_point"; a code "prompt" is put before the
                  program (a whole function replaces the prompt's signature, anything else is its body:
                  with_prompt), and is run by the checker too, for the helpers the tests call
    MBPP          "test_list" (assert statements, each a test case), with "test_setup_code" and
                  "test_imports" run by the checker first; an "entry_point" names the program's function
                  when the tests call it by a builtin's name

The verdict is never the program's to give: stdin/stdout and call-based outputs are compared here, in the
reward's process; assert tests run in a separate checker process whose calls of the program's functions
cross as plain data (docs/code.md). Returns {"score", "pass_rate", and for each failure kind the fraction of
the row's test cases that ended so} - logged as reward/pass_rate, reward/timeout, ...
"""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from nanoverl_core.config import settings_or_defaults
from nanoverl_core.errors import RewardError
from nanoverl_core.reward import GROUND_TRUTH_KEYS

from .sandbox import KINDS, Outcome, run_tests
from .settings import CodeSettings

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
METRICS = ("pass_rate", "no_code", *KINDS)


def extract_code(response: str, code_from: str) -> str:
    """The program in a response: its last fenced block (or all of it), <think> blocks removed."""
    text = THINK.sub("", response)
    if code_from == "last_block":
        blocks = FENCE.findall(text)
        if blocks:
            return blocks[-1]
    return text


def _field(sample: dict, path: str) -> Any:
    node: Any = sample
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _places(sample: dict, key: str) -> list[dict]:
    """The dicts a layout's fields may be in: the ground truth (a dict or JSON object), the row, extra_info."""
    places = []
    for path in [key] if key else GROUND_TRUTH_KEYS:
        value = _field(sample, path)
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                value = json.loads(value)
            except ValueError:
                raise RewardError(f"code: the row's {path} is not valid JSON test cases; fix the data") from None
        if isinstance(value, dict):
            places.append(value)
            break
        if key and value is None:
            raise RewardError(f"code: the data row has no field {key!r} ([reward.code] ground_truth_key); "
                              "fix the key or the data")
    return [*places, sample, *([sample["extra_info"]] if isinstance(sample.get("extra_info"), dict) else [])]


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def read_tests(sample: dict, settings: CodeSettings) -> dict[str, Any]:
    """The row's test cases: {"mode", "tests" (what the sandbox gets), "expected" (what stays here), "setup",
    "entry", "fn_name", "prefix" (code put before a program lacking the entry point)}."""
    for place in _places(sample, settings.ground_truth_key):
        if "inputs" in place and "outputs" in place:
            inputs, outputs = list(place["inputs"]), list(place["outputs"])
            if len(inputs) != len(outputs):
                raise RewardError(f"code: the row has {len(inputs)} inputs and {len(outputs)} outputs; fix the data")
            if place.get("fn_name"):
                tests = [{"args": x if isinstance(x, list) else [x]} for x in inputs]
                return {"mode": "call", "tests": tests, "expected": outputs, "fn_name": str(place["fn_name"])}
            return {"mode": "stdio", "tests": [{"stdin": _text(x)} for x in inputs],
                    "expected": [_text(y) for y in outputs]}
        if isinstance(place.get("test"), str) and place.get("entry_point"):
            prompt = place.get("prompt") if isinstance(place.get("prompt"), str) else ""
            return {"mode": "assert", "tests": [{"code": place["test"]}], "entry": str(place["entry_point"]),
                    "setup": prompt, "prefix": prompt}
        if isinstance(place.get("test_list"), list) and place["test_list"]:
            setup = "\n".join([*map(str, place.get("test_imports") or []), str(place.get("test_setup_code") or "")])
            names = [str(place["entry_point"])] if place.get("entry_point") else []  # e.g. a builtin's name
            return {"mode": "assert", "tests": [{"code": str(t)} for t in place["test_list"]], "setup": setup,
                    "names": names}
    raise RewardError("code: the data row has no test cases; give {\"inputs\", \"outputs\"[, \"fn_name\"]} in "
                      "reward_model.ground_truth, or test + entry_point (HumanEval), or test_list (MBPP)")


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def same_output(got: bytes, expected: str, compare: str) -> bool:
    text = got.decode(errors="replace")
    if compare == "exact":
        return got == expected.encode()
    if compare == "tokens":
        return text.split() == expected.split()
    return _lines(text) == _lines(expected)


def _plain(value: Any) -> Any:
    """Tuples as lists, all the way down (JSON test data has no tuples; verl's checker compares so too)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def same_value(reply: dict, expected: Any) -> bool:
    """The call's returned value (plain data, decoded with jail.wire.decode's limits) equals the expected one."""
    from .jail.wire import Uncarried, decode
    if "value" not in reply:
        return False
    try:
        got = _plain(decode(reply["value"]))
    except (Uncarried, RecursionError):
        return False
    expected = _plain(expected)
    return got == expected or isinstance(expected, list) and len(expected) == 1 and got == expected[0]


def verdicts(tests: dict[str, Any], outcomes: list[Outcome], compare: str) -> list[str]:
    """Each test case's kind: "pass" or a failure kind."""
    kinds = []
    for i, outcome in enumerate(outcomes):
        if outcome.kind != "ok":
            kinds.append(outcome.kind)
        elif tests["mode"] == "stdio":
            kinds.append("pass" if same_output(outcome.stdout, tests["expected"][i], compare) else "wrong_answer")
        elif tests["mode"] == "call":
            reply = outcome.reply
            kinds.append("runtime_error" if reply is None or "raised" in reply else
                         "pass" if same_value(reply, tests["expected"][i]) else "wrong_answer")
        else:
            kinds.append("pass")
    return kinds


def _defines(program: str, name: str) -> bool:
    """A top-level (flush-left) definition of `name`."""
    return re.search(rf"^def\s+{re.escape(name)}\s*\(", program, re.MULTILINE) is not None


def with_prompt(program: str, prompt: str, entry: str) -> str:
    """A HumanEval program joined to its code prompt, so that the tests see one complete definition either
    way. A whole function (a top-level `def <entry>(`) comes after the prompt: it replaces the prompt's
    docstring-only definition, and the prompt's imports and helpers stay. Anything else is the function's
    body and continues the signature (indented by four spaces first when its first line is flush left)."""
    if _defines(program, entry):
        return prompt.rstrip("\n") + "\n\n\n" + program
    first = next((line for line in program.splitlines() if line.strip()), "")
    if first and not first[0].isspace():
        program = textwrap.indent(program, "    ")
    return (prompt if prompt.endswith("\n") else prompt + "\n") + program


def score_row(response: str, sample: dict, settings: CodeSettings
              ) -> tuple[dict[str, float], list[str], list[Outcome]]:
    """The reward's dict, each test case's verdict ("pass" or its failure kind) and its outcome in the sandbox."""
    tests = read_tests(sample, settings)
    if settings.max_tests:
        tests["tests"] = tests["tests"][:settings.max_tests]
    program = extract_code(response, settings.code_from)
    metrics = dict.fromkeys(METRICS, 0.0)
    if not program.strip():
        return {"score": 0.0, **metrics, "no_code": 1.0}, [], []
    if tests.get("prefix") and tests.get("entry"):
        program = with_prompt(program, tests["prefix"], tests["entry"])
    outcomes = run_tests(program, tests["mode"], tests["tests"], settings.limits, settings.sandbox, settings.python,
                         setup=tests.get("setup", ""), entry=tests.get("entry", ""), fn_name=tests.get("fn_name", ""),
                         names=tests.get("names", []), accounting=settings.limits_per, cgroup=settings.cgroup)
    kinds = verdicts(tests, outcomes, settings.compare)
    n = len(kinds)
    for kind in kinds:
        metrics["pass_rate" if kind == "pass" else kind] += 1.0 / n
    score = metrics["pass_rate"] if settings.score == "fraction" else float(kinds.count("pass") == n)
    return {"score": score, **metrics}, kinds, outcomes


def code(prompt: str, response: str, sample: dict, settings: CodeSettings | None = None) -> dict[str, float]:
    """The registered reward (see the module doc)."""
    return score_row(response, sample, settings_or_defaults(settings, CodeSettings))[0]
