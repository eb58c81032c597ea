"""Two-digit problems no run has trained on, to evaluate the calculator agent with: any seed, any number,
plainly asked ("What is 23 + 45?") or reworded ("Add 23 and 45.", "Work out 23 * 45.").

    python examples/agents/fresh_problems.py --seed 4242 --n 96 --out /tmp/fresh.jsonl [--reworded]
    .venv-vllm/bin/nanoverl-train eval --config examples/configs/smollm2_agent_calculator.toml \
        --checkpoint runs/smollm2_agent_calculator 'data.val_files=["/tmp/fresh.jsonl"]'

Each row is drawn with random.Random(seed): an operation (+ - * in turn), then a, b in 10..99; a problem
in examples/data/arithmetic_agent/train.jsonl (the recipe's training problems; arithmetic_agent_worded asks
the same ones) or drawn before is skipped, so every row is new to the run. Rows are
examples/arithmetic/make_data.py's (`make_row`, the question reworded with --reworded, in phrasings that
none of the training rows uses), so examples/arithmetic/reward.py scores them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]
TRAIN = EXAMPLES / "data" / "arithmetic_agent" / "train.jsonl"
_spec = importlib.util.spec_from_file_location("make_data", EXAMPLES / "arithmetic" / "make_data.py")
make_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_data)
REWORDED = {"+": ["Add {a} and {b}.", "What do you get when you add {a} to {b}?", "Work out {a} + {b}.",
                  "Calculate the sum of {a} and {b}."],
            "-": ["Subtract {b} from {a}.", "What do you get when you take {b} away from {a}?",
                  "Work out {a} - {b}.", "Calculate {a} minus {b}."],
            "*": ["Multiply {a} by {b}.", "What do you get when you multiply {a} by {b}?", "Work out {a} * {b}.",
                  "Calculate the product of {a} and {b}."]}


def fresh_rows(seed: int, n: int, reworded: bool = False) -> list[dict]:
    """`n` problems drawn with `seed`, none among the training rows, none twice."""
    seen = {(r["extra_info"]["a"], r["extra_info"]["op"], r["extra_info"]["b"])
            for r in map(json.loads, TRAIN.read_text().splitlines())}
    rng = random.Random(seed)
    rows = []
    low, high = make_data.TWO_DIGITS[0], make_data.TWO_DIGITS[-1]
    while len(rows) < n:
        op = "+-*"[len(rows) % 3]
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        row = make_data.make_row(a, op, b)
        if reworded:
            row["prompt"] = [{"role": "user", "content": rng.choice(REWORDED[op]).format(a=a, b=b)}]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--reworded", action="store_true", help="ask in other words than the training rows")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in fresh_rows(args.seed, args.n, args.reworded)))
    print(f"{args.out}: {args.n} rows")


if __name__ == "__main__":
    main()
