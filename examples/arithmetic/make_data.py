"""The arithmetic tasks: write their chat-format train / validation rows.

    python examples/arithmetic/make_data.py            # -> examples/data/arithmetic/{train,val}.jsonl
    python examples/arithmetic/make_data.py --check    # exit 1 unless the files are what it would write
    python examples/arithmetic/make_data.py --task two_digit   # -> examples/data/arithmetic_tool/...

Every problem "What is a OP b?" with a, b in 0..9 and OP in + - * (300 in all, 100 per operation) is
one row:

    {"data_source": "arithmetic_add", "prompt": [{"role": "user", "content": "What is 3 + 4?"}],
     "reward_model": {"ground_truth": "7"}, "extra_info": {"a": 3, "b": 4, "op": "+"}}

data_source is arithmetic_add / arithmetic_sub / arithmetic_mul by operation (the trainer logs
validation rewards per data_source); ground truths run from -9 (0 - 9) to 81 (9 * 9).

The split: for each operation in the order + - *, a random.Random(SEED) draws that operation's
held-out (a, b) pairs, 22 for + and 21 each for - and * (64 in all, as even as 64 allows); the other
236 problems (78 +, 79 -, 79 *) are the training rows. No (a, op, b) is in both files. Rows are written
in a fixed order (operation, then a, then b), so a re-run reproduces both files byte for byte. The
reward is examples/arithmetic/reward.py.

The two-digit task (`--task two_digit`, for the calculator tool) asks the same question with a, b in
10..99: 8100 pairs per operation, too many to list, so for each operation in the order + - * a
random.Random(SEED + 1) draws 32 held-out and 400 training pairs, disjoint (96 and 1200 rows). Each
prompt starts with the same two solved examples (DEMO_PROBLEMS: a call, its result, the answer as an
equation), which are in neither split; `--demo answer` ends them "The answer is 943." instead, and
`--demo none` leaves them out (docs/results.md: what SmolLM2-135M-Instruct does with each).

`--worded` (two-digit, for the agent recipe: examples/data/arithmetic_agent_worded) asks each training
problem in words instead with probability one half, a random.Random(SEED + 2) picking the row and one of
WORDINGS' four phrasings of its operation ("What is the sum of 23 and 45?", "Find 23 plus 45."); the
held-out rows stay "What is a OP b?". examples/agents/fresh_problems.py --reworded asks in other phrasings.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OPS = {"+": ("arithmetic_add", lambda a, b: a + b),
       "-": ("arithmetic_sub", lambda a, b: a - b),
       "*": ("arithmetic_mul", lambda a, b: a * b)}
DIGITS = range(10)
SEED = 0
HELD_OUT = {"+": 22, "-": 21, "*": 21}  # 64 validation problems
OUT = Path(__file__).resolve().parents[1] / "data" / "arithmetic"
TWO_DIGITS = range(10, 100)
TWO_DIGIT_SPLIT = (32, 400)              # per operation: held-out, training pairs
TWO_DIGIT_OUT = OUT.with_name("arithmetic_tool")
DEMO_PROBLEMS = ((23, "*", 41), (57, "-", 88))
WORDINGS = {"+": ("What is the sum of {a} and {b}?", "Find {a} plus {b}.", "{a} plus {b} is what?",
                  "Compute {a} + {b}."),
            "-": ("What is {a} minus {b}?", "Find the difference {a} - {b}.", "Take {b} from {a}. What is left?",
                  "Compute {a} - {b}."),
            "*": ("What is {a} times {b}?", "Find the product of {a} and {b}.", "{a} multiplied by {b} is what?",
                  "Compute {a} * {b}.")}


def demo_messages(style: str = "equation") -> list[dict]:
    """Two solved problems as chat turns: the user asks, the model calls `calculate`, the tool answers,
    the model states the result as an equation ("23 * 41 = 943"; style "answer": "The answer is 943.";
    "none": no examples, the tool's description alone)."""
    if style == "none":
        return []
    messages = []
    for a, op, b in DEMO_PROBLEMS:
        call = {"name": "calculate", "arguments": {"expression": f"{a} {op} {b}"}}
        result = str(OPS[op][1](a, b))
        messages += [{"role": "user", "content": f"What is {a} {op} {b}?"},
                     {"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"},
                     {"role": "tool", "content": result},
                     {"role": "assistant", "content": f"{a} {op} {b} = {result}" if style == "equation"
                      else f"The answer is {result}."}]
    return messages


def make_row(a: int, op: str, b: int, demo: list[dict] | None = None) -> dict:
    data_source, fn = OPS[op]
    return {"data_source": data_source,
            "prompt": [*(demo or []), {"role": "user", "content": f"What is {a} {op} {b}?"}],
            "reward_model": {"ground_truth": str(fn(a, b))},
            "extra_info": {"a": a, "b": b, "op": op}}


def split(seed: int = SEED) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """(train, val) lists of (a, op, b), each in the order operation, a, b."""
    rng = random.Random(seed)
    train, val = [], []
    for op, n_val in HELD_OUT.items():
        pairs = [(a, b) for a in DIGITS for b in DIGITS]
        held = set(rng.sample(pairs, n_val))
        for a, b in pairs:
            (val if (a, b) in held else train).append((a, op, b))
    return train, val


def split_two_digit(seed: int = SEED + 1) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """(train, val) of the two-digit task, each in the order operation, a, b."""
    rng = random.Random(seed)
    train, val = [], []
    n_val, n_train = TWO_DIGIT_SPLIT
    for op in OPS:
        pairs = [(a, b) for a in TWO_DIGITS for b in TWO_DIGITS if (a, op, b) not in DEMO_PROBLEMS]
        drawn = rng.sample(pairs, n_val + n_train)
        val += sorted((a, op, b) for a, b in drawn[:n_val])
        train += sorted((a, op, b) for a, b in drawn[n_val:])
    return train, val


def render(problems: list[tuple[int, str, int]], demo: list[dict] | None = None,
           reword: random.Random | None = None) -> str:
    """The rows as JSON lines; with `reword`, that generator rewords about half of them (WORDINGS)."""
    rows = []
    for a, op, b in problems:
        row = make_row(a, op, b, demo)
        if reword is not None and reword.random() < 0.5:
            row["prompt"][-1]["content"] = reword.choice(WORDINGS[op]).format(a=a, b=b)
        rows.append(json.dumps(row) + "\n")
    return "".join(rows)


def files(task: str = "one_digit", seed: int = SEED, demo: str = "equation", worded: bool = False) -> dict[str, str]:
    """{file name: its exact text}."""
    if task == "one_digit":
        train, val = split(seed)
        return {"train.jsonl": render(train), "val.jsonl": render(val)}
    train, val = split_two_digit(seed + 1)
    reword = random.Random(seed + 2) if worded else None
    return {"train.jsonl": render(train, demo_messages(demo), reword), "val.jsonl": render(val, demo_messages(demo))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--task", choices=["one_digit", "two_digit"], default="one_digit")
    parser.add_argument("--demo", choices=["equation", "answer", "none"], default="equation",
                        help="two_digit: how the prompt's two solved examples answer (none: no examples)")
    parser.add_argument("--worded", action="store_true",
                        help="two_digit: ask about half the training problems in words (WORDINGS)")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default {OUT} or {TWO_DIGIT_OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ")
    args = parser.parse_args(argv)
    if args.worded and args.task != "two_digit":
        parser.exit(2, "error: --worded rewords the two-digit task's rows; add --task two_digit\n")
    out = args.out or (OUT if args.task == "one_digit" else TWO_DIGIT_OUT)
    stale = []
    for name, text in files(args.task, demo=args.demo, worded=args.worded).items():
        path = out / name
        if args.check:
            if not path.is_file() or path.read_bytes() != text.encode():
                stale.append(str(path))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode())
            print(f"wrote {path} ({text.count(chr(10))} rows)")
    if stale:
        print(f"differs from the generator: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
