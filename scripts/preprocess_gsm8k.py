"""Build GSM8K in verl's parquet layout, the files shipped in examples/data/gsm8k, from the hub copy.

    python scripts/preprocess_gsm8k.py                  # -> examples/data/gsm8k/{train,test}.parquet
    python scripts/preprocess_gsm8k.py --out DIR        # somewhere else
    python scripts/preprocess_gsm8k.py --check          # rebuild in memory, compare with the shipped files

Needs the `datasets` package and a copy of "openai/gsm8k" (config "main") on the Hugging Face hub or
in its local cache; nanoverl itself never needs this script (the repository ships the result). The
layout is verl's examples/data_preprocess/gsm8k.py, row for row:

    data_source   "openai/gsm8k"
    prompt        [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": the number after "#### ", commas removed}
    extra_info    {"split": "train" | "test", "index": the row's position in its split,
                   "answer": the worked answer, "question": the question}

`make_row` is the whole transformation; tests/test_preprocess_gsm8k.py checks that it rebuilds the
shipped rows exactly from their own extra_info (no network).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
OUT = Path(__file__).resolve().parents[1] / "examples" / "data" / "gsm8k"
_SOLUTION = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(answer: str) -> str:
    """'... #### 1,600' -> '1600' (verl's rule: the first "#### <number>", commas dropped)."""
    match = _SOLUTION.search(answer)
    if match is None:
        raise ValueError(f"no '#### <number>' in the answer {answer[-60:]!r}")
    return match.group(1).replace(",", "")


def make_row(question: str, answer: str, split: str, index: int) -> dict:
    """One raw GSM8K example (question, worked answer) as a row of the shipped parquet files."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_solution(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def features():
    """The column types of the shipped files (struct fields in the order those files store them)."""
    from datasets import Features, Value
    string = Value("string")
    return Features({
        "data_source": string,
        "prompt": [{"content": string, "role": string}],
        "ability": string,
        "reward_model": {"ground_truth": string, "style": string},
        "extra_info": {"answer": string, "index": Value("int64"), "question": string, "split": string},
    })


def write_parquet(rows: list[dict], path: Path) -> None:
    """The rows as a parquet file with the shipped column types (and the `datasets` feature metadata).
    Written with pyarrow directly: a `datasets.Dataset` would hash the whole table with dill first,
    which fails on some installs (pyarrow's MonthDayNano type cannot be pickled there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows, schema=features().arrow_schema), str(path))


def build(split: str) -> list[dict]:
    """A split of the hub copy as rows of the shipped layout (needs the hub or its cache)."""
    import datasets
    raw = datasets.load_dataset(DATA_SOURCE, "main", split=split)
    return [make_row(ex["question"], ex["answer"], split, i) for i, ex in enumerate(raw)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; compare the rebuilt rows with the parquet files in --out")
    args = parser.parse_args(argv)
    import datasets
    datasets.disable_progress_bars()
    same = True
    for split in SPLITS:
        try:
            rows = build(split)
        except ConnectionError as exc:  # offline without a cached copy
            print(f"error: could not load {DATA_SOURCE} ({exc}); this script needs the Hugging Face hub or its "
                  f"local cache. The repository already ships the result in {OUT}", file=sys.stderr)
            return 2
        path = args.out / f"{split}.parquet"
        if args.check:
            shipped = datasets.load_dataset("parquet", data_files=str(path), split="train").to_list()
            ok = shipped == rows
            same &= ok
            print(f"{path}: {len(rows)} rows rebuilt, {len(shipped)} there, {'identical' if ok else 'DIFFERENT'}")
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            write_parquet(rows, path)
            print(f"wrote {path} ({len(rows)} rows)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
