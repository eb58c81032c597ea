"""Score dumped model responses with the hand-written `gsm8k` reward and with `math_verify`; print where they disagree.

    python scripts/compare_scorers.py DUMP.jsonl [DUMP.jsonl ...] [--data DATA_FILE ...] [--examples N] \
        [--gold-format latex|expr]

Each input line is one response. `nanoverl-train eval --config FILE --samples DUMP.jsonl` (add
`--checkpoint DIR` for a trained policy) writes "response" with the data row under "row" (GSM8K's and
the arithmetic task's rows hold the gold answer in reward_model.ground_truth); a line without "row" is
the row itself when it has a ground truth (reward_model.ground_truth, ground_truth, target or answer).
A training run's rollouts/step_<N>.jsonl hold the rendered "prompt" and the "response" but no ground
truth: with `--data` (the run's data files, jsonl / json / parquet) each such line gets the data row whose
prompt text (a chat prompt's last user message) its prompt contains, the one found last in it (so a
few-shot example earlier in the prompt does not count). For example, on the arithmetic run's dumps:

    python scripts/compare_scorers.py runs/smollm2_arithmetic/rollouts/*.jsonl \
        --data examples/data/arithmetic/train.jsonl examples/data/arithmetic/val.jsonl

Both rewards come from the installed plugins by name, as the trainer calls them: `gsm8k` (nanoverl-hf) and
`math_verify` (nanoverl-math, default settings but `gold_format`); a response is correct for a scorer when
it gets that scorer's full score (1.0). Printed, as JSON on stdout:

    rows, agree, disagree, errors (rows a scorer raised on: no or non-numeric gold answer),
    verdicts      {"both_correct", "both_wrong", "gsm8k_only", "math_verify_only"}: counts,
    by_source     the same four counts per data_source,
    classes       every disagreement class, most frequent first: {"class", "count", "examples"}, the class
                  being which scorer accepts ("gsm8k_only" / "math_verify_only") and the first feature of
                  the response that fits (FEATURES below), each example with the gold answer, both
                  extracted answers and the response's end,
    error_examples  up to N rows a scorer raised on, with the message.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from nanoverl_core import UserError, load_registry
from nanoverl_core.reward import ground_truth_value
from nanoverl_core.trainer.commands import response_lines

FEATURES = [  # (name, pattern on the response), the first that matches names a disagreement's class
    ("no answer for math_verify", None),
    ("no answer for gsm8k", None),
    ("#### marker", re.compile(r"####")),
    ("\\boxed{}", re.compile(r"\\boxed")),
    ("fraction", re.compile(r"\\[dt]?frac|\d\s*/\s*\d")),
    ("percent", re.compile(r"%")),
    ("escaped \\$", re.compile(r"\\\$")),
    ("comma between digits", re.compile(r"\d,\d")),
    ("expression with an operator", re.compile(r"\d\s*[-+*x×÷=]\s*-?\d")),
    ("decimal point", re.compile(r"\d\.\d")),
]
TAIL = 300


def feature(response: str, gsm8k_answer, math_verify_answer) -> str:
    if math_verify_answer is None:
        return FEATURES[0][0]
    if gsm8k_answer is None:
        return FEATURES[1][0]
    return next((name for name, pattern in FEATURES[2:] if pattern.search(response)), "other")


def read_rows(paths: list[Path]) -> list[dict]:
    hint = "give the jsonl that `nanoverl-train eval --samples` writes"
    return [row for path in paths for row in response_lines(path, hint)]


def prompt_text(row: dict) -> str:
    """A data row's prompt as a dump's rendered prompt contains it: the text, or a chat's last user message."""
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else None
    return prompt if isinstance(prompt, str) else ""


def attach_rows(dump: list[dict], data: list[dict]) -> list[dict]:
    """Each dump line without "row" and without a ground truth of its own, with "row": the data row whose prompt
    text its "prompt" contains, the one starting last (then the longest); lines that match none are left as they are."""
    texts = [(prompt_text(row), row) for row in data]
    texts = [(text, row) for text, row in texts if text]
    found: dict[str, dict | None] = {}
    out = []
    for item in dump:
        if "row" in item or _gold(item) is not None:
            out.append(item)
            continue
        prompt = str(item.get("prompt", ""))
        if prompt not in found:
            hits = [(prompt.rfind(text), len(text), i) for i, (text, _) in enumerate(texts) if text in prompt]
            found[prompt] = texts[max(hits)[2]][1] if hits else None
        out.append({**item, "row": found[prompt]} if found[prompt] is not None else item)
    return out


def compare(rows: list[dict], examples: int = 3, gold_format: str = "latex") -> dict:
    """The report (see the module docstring) of `rows`, each {"response", "row" or the row's own fields}."""
    registry = load_registry()
    gsm8k = registry.get("reward", "gsm8k")            # a missing plugin: its pip install line
    math_verify = registry.get("reward", "math_verify")
    settings = registry.settings_class("reward", "math_verify")(gold_format=gold_format)
    from math_verify import parse
    from nanoverl_hf.rewards import extract_answer
    verdicts, by_source = Counter(), defaultdict(Counter)
    classes: dict[str, list[dict]] = defaultdict(list)
    errors = []
    for item in rows:
        sample, response = item.get("row", item), item["response"]
        prompt = item.get("prompt", "")
        try:
            g = gsm8k(prompt, response, sample)["score"] == 1.0
            m = math_verify(prompt, response, sample, settings)["score"] == settings.correct
        except UserError as exc:
            errors.append({"message": str(exc), "response_end": response[-TAIL:]})
            continue
        verdict = {(True, True): "both_correct", (False, False): "both_wrong",
                   (True, False): "gsm8k_only", (False, True): "math_verify_only"}[(g, m)]
        verdicts[verdict] += 1
        by_source[str(item.get("data_source", sample.get("data_source", "default")))][verdict] += 1
        if g != m:
            g_answer = extract_answer(response)[0]
            parsed = parse(response)
            m_answer = str(parsed[-1]) if parsed else None
            name = f"{verdict}: {feature(response, g_answer, m_answer)}"
            classes[name].append({"ground_truth": _gold(sample), "gsm8k_answer": None if g_answer is None else str(g_answer),
                                  "math_verify_answer": m_answer, "response_end": response[-TAIL:]})
    disagree = verdicts["gsm8k_only"] + verdicts["math_verify_only"]
    return {"rows": len(rows), "agree": verdicts["both_correct"] + verdicts["both_wrong"], "disagree": disagree,
            "errors": len(errors),
            "verdicts": {k: verdicts[k] for k in ("both_correct", "both_wrong", "gsm8k_only", "math_verify_only")},
            "by_source": {src: dict(counts) for src, counts in sorted(by_source.items())},
            "classes": [{"class": name, "count": len(found), "examples": found[:examples]}
                        for name, found in sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[0]))],
            "error_examples": errors[:examples]}


def _gold(sample: dict) -> str | None:
    try:
        return str(ground_truth_value(sample))
    except UserError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("samples", nargs="+", type=Path, metavar="DUMP.jsonl",
                   help="what `nanoverl-train eval --samples` wrote, or a run's rollouts/step_<N>.jsonl (with --data)")
    p.add_argument("--data", nargs="+", default=[], metavar="DATA_FILE",
                   help="the data files, for dump lines without a ground truth (a run's rollouts/step_<N>.jsonl)")
    p.add_argument("--examples", type=int, default=3, help="examples per disagreement class (default 3)")
    p.add_argument("--gold-format", choices=("latex", "expr"), default="latex",
                   help="[reward.math_verify] gold_format (default latex)")
    args = p.parse_args(argv)
    try:
        for path in args.samples:
            if not path.is_file():
                raise UserError(f"{path} does not exist; give the jsonl that `nanoverl-train eval --samples` wrote")
        rows = read_rows(args.samples)
        if args.data:
            from nanoverl_core.data import read_rows as read_data
            rows = attach_rows(rows, [{k: v for k, v in row.items() if not k.startswith("__")}
                                      for row in read_data(args.data, "--data")])
        report = compare(rows, args.examples, args.gold_format)
    except UserError as exc:  # one line, exit 2, as nanoverl-train
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
