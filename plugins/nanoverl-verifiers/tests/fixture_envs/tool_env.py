"""A tool environment written with verifiers' own API (ToolEnv with a Python function as its tool), its
dataset built in memory; loaded as "path/to/tool_env.py:load_tool_environment". The tool writes each call it
gets to env_args' record_dir; the rubric rewards a final reply that holds the answer."""

import json
from pathlib import Path

import verifiers as vf
from datasets import Dataset


def load_tool_environment(record_dir: str = "", max_turns: int = 3) -> vf.Environment:
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        if record_dir:
            with open(Path(record_dir, "tool_calls.jsonl"), "a") as f:
                f.write(json.dumps({"a": a, "b": b}) + "\n")
        return a + b

    parser = vf.Parser()

    def correct(completion, answer) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    dataset = Dataset.from_list([{"question": f"What is {a} + {a + 1}? Use the tool.", "answer": str(2 * a + 1)}
                                 for a in range(4)])
    return vf.ToolEnv(tools=[add], max_turns=max_turns, dataset=dataset, parser=parser,
                      rubric=vf.Rubric(funcs=[correct], parser=parser))
