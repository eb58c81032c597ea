"""How often the `judge` reward agrees with the exact-match reward on arithmetic answers; prints JSON.

    python plugins/nanoverl-judge/scripts/agreement.py --serve MODEL_FOLDER [--split val] [--n 200] [--seed 0]
    python plugins/nanoverl-judge/scripts/agreement.py --base-url http://127.0.0.1:8000/v1 --model NAME

The answers: `--n` (prompt, answer) pairs over the rows of examples/data/arithmetic/<split>.jsonl (one-digit
`a OP b`), drawn with `--seed`; the first half right (the row's result), the second half wrong (the result
plus an offset k drawn from -3..-1, 1..3), each written as "{v}" or "The answer is {v}." (drawn too), then
shuffled. `--split val` is the held-out evaluation set; `--split train` a separate one for trying rubrics.
Exact match (examples/arithmetic/reward.py, the last integer of the answer against the result) is the
reference; the judge (`nanoverl_judge.reward.judge` called as the runtime calls it, its default rubric unless
`--template-file`) says "right" when its normalised score is >= `--threshold`. Reported: precision and recall
of "right" against exact match, accuracy, and the rows the judge failed on (each kind), over all n rows (a
failed row counts as "not right") and over the rows it scored.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))


def answers(split: str, n: int, seed: int) -> list[dict]:
    """n rows {"row", "prompt", "response", "right"}: half right, half wrong, shuffled with the seed."""
    rows = [json.loads(line) for line in (ROOT / "examples" / "data" / "arithmetic" / f"{split}.jsonl").open()]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        row = rng.choice(rows)
        value = int(row["reward_model"]["ground_truth"])
        right = i < n // 2
        if not right:
            value += rng.choice([-3, -2, -1, 1, 2, 3])
        form = rng.choice(["{v}", "The answer is {v}."])
        out.append({"row": row, "prompt": row["prompt"][-1]["content"], "response": form.format(v=value),
                    "right": right})
    rng.shuffle(out)
    return out


def summary(labels: list[bool], said: list[bool | None]) -> dict:
    """Precision and recall of the judge's "right" against exact match; None (a failed row) counts as not right."""
    tp = sum(1 for y, s in zip(labels, said) if y and s)
    fp = sum(1 for y, s in zip(labels, said) if not y and s)
    fn = sum(1 for y, s in zip(labels, said) if y and not s)
    tn = sum(1 for y, s in zip(labels, said) if not y and not s)
    return {"rows": len(labels), "judge_right": tp + fp, "tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "precision": round(tp / (tp + fp), 4) if tp + fp else None,
            "recall": round(tp / (tp + fn), 4) if tp + fn else None,
            "accuracy": round((tp + tn) / len(labels), 4) if labels else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", default="", help="a local HF model folder the judge serves itself")
    parser.add_argument("--base-url", default="")
    parser.add_argument("--model", default="")
    parser.add_argument("--split", default="val", choices=["val", "train"])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--template-file", nargs="*", default=[""],
                        help="rubric files to compare, one result each (\"\": the built-in rubric)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--score-pattern", default="", help="[reward.judge] score_pattern (empty: the default)")
    parser.add_argument("--max-score", type=float, default=10.0)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--out", default="", help="a folder for the judge's cache and request log")
    args = parser.parse_args(argv)
    from reward import arithmetic

    from nanoverl_judge.settings import JudgeSettings

    items = answers(args.split, args.n, args.seed)
    labels = [arithmetic(i["prompt"], i["response"], i["row"]) == 1.0 for i in items]
    assert labels == [i["right"] for i in items], "the construction disagrees with exact match"
    for template_file in args.template_file:
        settings = JudgeSettings(base_url=args.base_url, model=args.model or ("local" if args.serve else ""),
                                 serve=args.serve, template_file=template_file, max_tokens=args.max_tokens,
                                 score_pattern=args.score_pattern, max_score=args.max_score, timeout_s=600, cache=bool(args.out), log=bool(args.out))
        print(json.dumps(measure(items, labels, settings, args, template_file), indent=1), flush=True)


def measure(items: list[dict], labels: list[bool], settings, args, template_file: str) -> dict:
    from nanoverl_core.reward import CallError, RewardContext
    from nanoverl_judge.reward import judge

    context = RewardContext("val", 0, args.out, tuple(str(i) for i in range(len(items))), tuple(range(len(items))))
    start = time.monotonic()
    out = judge([i["prompt"] for i in items], [i["response"] for i in items], [i["row"] for i in items], settings,
                context)
    seconds = time.monotonic() - start
    said = [None if isinstance(o, CallError) else o["score"] >= args.threshold for o in out]
    scored = [k for k, s in enumerate(said) if s is not None]
    return {"judge": args.serve or args.model, "rubric": template_file or "built-in", "split": args.split,
            "seed": args.seed, "threshold": args.threshold, "seconds": round(seconds, 1),
            "failed": dict(Counter(o.kind for o in out if isinstance(o, CallError))),
            "scores": dict(Counter(round(o["score"], 2) for o in out if not isinstance(o, CallError))),
            "all_rows": summary(labels, said),
            "scored_rows": summary([labels[k] for k in scored], [said[k] for k in scored])}


if __name__ == "__main__":
    main()
