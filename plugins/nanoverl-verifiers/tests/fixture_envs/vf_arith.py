"""A single-turn environment written with verifiers' own API (SingleTurnEnv, Rubric, Parser), its datasets
built in memory: the module an installed environment "vf-arith" would be, loaded by that id through
verifiers' `load_environment` (this folder on the Python path).

Its rubric scores with two reward functions (1 for the answer in the reply, plus 0.005 per character of the
reply, so a random model's rows get rewards that differ) and a metric `chars`, which also writes what the
rubric saw (the prompt and the completion) to env_args' record_dir, one JSON file per rollout."""

import json
import os
import uuid
from pathlib import Path

import verifiers as vf
from datasets import Dataset

SYSTEM = "Add the two numbers."


def rows(start: int, count: int) -> list[dict]:
    return [{"question": f"{a}+{a + 1}=", "answer": str(2 * a + 1), "info": {"a": a}}
            for a in range(start, start + count)]


def load_environment(num_examples: int = 6, num_eval: int = 2, record_dir: str = "") -> vf.Environment:
    if num_examples < 1:
        raise ValueError(f"num_examples must be at least 1, got {num_examples}")
    parser = vf.Parser()

    def correct(completion, answer) -> float:
        return float(answer in (parser.parse_answer(completion) or ""))

    def length(completion) -> float:
        return 0.005 * len(parser.parse_answer(completion) or "")

    def chars(prompt, completion, answer, info, state) -> float:
        text = parser.parse_answer(completion)
        if record_dir:
            record = {"prompt": [{"role": m.role, "content": m.content} for m in prompt],
                      "completion": None if text is None else text, "answer": answer, "info": info,
                      "example_id": state["example_id"], "pid": os.getpid()}
            Path(record_dir, f"{uuid.uuid4().hex}.json").write_text(json.dumps(record))
        return float(len(text or ""))

    rubric = vf.Rubric(funcs=[correct, length, chars], weights=[1.0, 1.0, 0.0], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows(0, num_examples)),
                            eval_dataset=Dataset.from_list(rows(100, num_eval)) if num_eval else None,
                            system_prompt=SYSTEM, parser=parser, rubric=rubric)
