"""Built-in environments: `copy_turns` (the copy task over several turns) and `calculator` (a tool).

`copy_turns` is the multi-turn twin of the copy tasks (examples/data/debug_copy, tiny_copy): the
target is answered a few characters per turn (or whole, `repeats` times), the environment answers
each turn with a separator and rewards it with its share of char_match, so a whole episode scores
like char_match on the target. It needs no tokenizer beyond digits and "=", so the debug and tiny models learn it on CPU.

`calculator` gives the model one tool, `calculate(expression)`, for integer arithmetic; the
[reward] scores the final answer (examples/arithmetic).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import attrs

from ..config import settings_or_defaults
from ..env import EnvStep, Turn, tool_environment
from ..reward.calls import ground_truth_value
from .debug_settings import CopyTurnsSettings


@attrs.define
class CopyTurns:
    target: str
    settings: CopyTurnsSettings

    def step(self, turn: Turn) -> EnvStep:
        size, turns = self.settings.chars_per_turn, self.settings.repeats
        chunk = self.target[turn.index * size:(turn.index + 1) * size] if size else self.target
        answer = turn.text.strip()
        hits = sum(a == b for a, b in zip(answer, chunk)) / max(len(chunk), len(answer), 1)
        share = len(chunk) / len(self.target) if size else 1 / turns
        done = (turn.index + 1) * size >= len(self.target) if size else turn.index + 1 >= turns
        return EnvStep(observation=self.settings.separator, reward=hits * share, done=done)


def copy_turns(sample: dict[str, Any], settings: CopyTurnsSettings | None = None) -> CopyTurns:
    return CopyTurns(str(ground_truth_value(sample)).strip(), settings_or_defaults(settings, CopyTurnsSettings))


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Mult) and abs(left) * abs(right) > 10**12:
            raise ValueError("the result is too large")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers, + - * / // and parentheses are allowed")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / and parentheses, for example "37 * (12 - 5)"
    """
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


calculator = tool_environment(calculate)
