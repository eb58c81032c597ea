"""The tiny copy task: write its data and its from-scratch model folder.

    python examples/tiny_task/make_task.py            # from the repository root

Writes
  examples/data/tiny_copy/{train,val}.jsonl   rows {"prompt": "4831=", "target": "4831", "data_source": "tiny_copy"}
  examples/data/tiny_phone/{train,val}.jsonl  the same strings as codes of the phone-book tool (phone_book.py):
                                              {"prompt": "4831=", "target": <the number lookup("4831") gives>,
                                              "data_source": "tiny_phone"}
  examples/tiny_task/model/                   a Llama config.json + character tokenizer, no weights:
                                              the hf worker draws random weights from trainer.seed
  examples/tiny_task/model_vllm/              the same with two heads of 32 instead of four of 16 (same
                                              parameter count): vLLM's CPU attention has no head_dim 16

The policy must answer a prompt "dddd=" with the same four digits and then EOS. The reward is the
core's built-in `char_match`: the fraction of positions that match the target, over the longer of the
two strings, so a random model scores about 0.05 and a perfect one 1.0. Train and validation strings
are disjoint. Everything is seeded, so the files are identical on every run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

from nanoverl_hf.tiny import build_tiny_model, num_parameters

ROOT = Path(__file__).resolve().parents[2]


def write_rows(path: Path, strings: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in strings:
            f.write(json.dumps({"prompt": f"{s}=", "target": s, "data_source": "tiny_copy"}) + "\n")


def write_phone_rows(path: Path, codes: list[str]) -> None:
    """The phone-book example's rows: a code, and the number the book files under it."""
    spec = importlib.util.spec_from_file_location("phone_book", ROOT / "examples/tiny_task/phone_book.py")
    book = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(book)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for code in codes:
            f.write(json.dumps({"prompt": f"{code}=", "target": book.lookup(code), "data_source": "tiny_phone"}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digits", type=int, default=4)
    parser.add_argument("--train", type=int, default=2048, help="training prompts")
    parser.add_argument("--val", type=int, default=64, help="validation prompts (disjoint from training)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=str(ROOT / "examples/data/tiny_copy"))
    parser.add_argument("--model-dir", default=str(ROOT / "examples/tiny_task/model"))
    parser.add_argument("--vllm-model-dir", default=str(ROOT / "examples/tiny_task/model_vllm"))
    args = parser.parse_args()

    rng = random.Random(args.seed)
    strings = [str(x).zfill(args.digits) for x in rng.sample(range(10 ** args.digits), args.train + args.val)]
    write_rows(Path(args.data_dir) / "train.jsonl", strings[:args.train])
    write_rows(Path(args.data_dir) / "val.jsonl", strings[args.train:])
    if args.digits == 4:  # the phone book files 4-digit codes
        phone_dir = Path(args.data_dir).parent / "tiny_phone"
        write_phone_rows(phone_dir / "train.jsonl", strings[:args.train])
        write_phone_rows(phone_dir / "val.jsonl", strings[args.train:])
    model = build_tiny_model(args.model_dir, alphabet="0123456789=")
    vllm_model = build_tiny_model(args.vllm_model_dir, alphabet="0123456789=", heads=2)
    print(f"wrote {args.train} train / {args.val} val prompts to {args.data_dir}")
    for folder in (model, vllm_model):
        print(f"wrote {folder} ({num_parameters(folder):,} parameters, random weights drawn at load time)")


if __name__ == "__main__":
    main()
