"""The one-digit arithmetic task: write its chat-format train / validation rows.

    python examples/arithmetic/make_data.py            # -> examples/data/arithmetic/{train,val}.jsonl
    python examples/arithmetic/make_data.py --check    # exit 1 unless the files are what it would write

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


def make_row(a: int, op: str, b: int) -> dict:
    data_source, fn = OPS[op]
    return {"data_source": data_source,
            "prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
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


def render(problems: list[tuple[int, str, int]]) -> str:
    return "".join(json.dumps(make_row(a, op, b)) + "\n" for a, op, b in problems)


def files(seed: int = SEED) -> dict[str, str]:
    """{file name: its exact text}."""
    train, val = split(seed)
    return {"train.jsonl": render(train), "val.jsonl": render(val)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ")
    args = parser.parse_args(argv)
    stale = []
    for name, text in files().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_bytes() != text.encode():
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode())
            print(f"wrote {path} ({text.count(chr(10))} rows)")
    if stale:
        print(f"differs from the generator: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
