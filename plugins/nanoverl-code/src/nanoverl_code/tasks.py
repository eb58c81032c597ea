"""The catalogue of generated programming tasks: small Python functions, each kind with its parameters drawn
per task, its reference solution, and the arguments its test cases call it with.

A kind is a function `kind(rng) -> Spec`; `draw(kind, rng, tests)` turns a Spec into a Task whose expected
values are the reference solution's own results on the drawn arguments (the reference is this module's code,
run here, never the model's). Levels: 1 one operation, 2 a condition or two operations, 3 a loop with state
or a rule in several parts.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from random import Random
from typing import Any

import attrs


@attrs.frozen
class Spec:
    signature: str
    """The function's name and parameters, "f(x)"."""
    text: str
    """What it returns, completing "Write a Python function `f(x)` that ..."."""
    body: str
    """The reference solution's body (unindented lines)."""
    args: Callable[[Random], list[Any]]
    """Draws one test case's arguments."""


@attrs.frozen
class Task:
    kind: str
    level: int
    fn_name: str
    question: str
    """"Write a Python function `f(x)` that returns x multiplied by 3 plus 1."""
    solution: str
    inputs: list[list[Any]]
    outputs: list[Any]


WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "bread", "chair", "grass", "mouse", "light",
         "sun", "cat", "dog", "sky", "tree", "book", "fish", "bird", "hat", "cup", "car", "map", "egg", "owl",
         "banana", "garden", "window", "planet", "yellow", "silver", "button", "candle")


def _ints(rng: Random, low: int = -9, high: int = 20, min_len: int = 0, max_len: int = 7) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(min_len, max_len))]


def _letters(rng: Random, alphabet: str = string.ascii_lowercase, max_len: int = 10) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len)))


# ---- level 1: one operation -----------------------------------------------------------------------------------
def affine(rng: Random) -> Spec:
    a, b = rng.randint(2, 9), rng.randint(1, 20)
    return Spec("f(x)", f"returns x multiplied by {a} plus {b}", f"return x * {a} + {b}",
                lambda r: [r.randint(-20, 20)])


def each(rng: Random) -> Spec:
    op = rng.choice(("+", "-", "*"))
    k = rng.randint(2, 9) if op == "*" else rng.randint(1, 30)
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    return Spec("each(xs)", f"returns the list of every number of the list xs {word} {k}, in the same order",
                f"return [x {op} {k} for x in xs]", lambda r: [_ints(r)])


def count_char(rng: Random) -> Spec:
    c, other = rng.choice(string.ascii_lowercase), rng.random() < 0.5
    alphabet = c * 4 + "abcdefghij"
    text = f"how many characters of the string s are not '{c}'" if other else \
        f"how many times the letter '{c}' appears in the string s"
    return Spec("count_char(s)", f"returns {text}", f"return len(s) - s.count('{c}')" if other else
                f"return s.count('{c}')", lambda r: [_letters(r, alphabet)])


def ends(rng: Random) -> Spec:
    k, which = rng.randint(1, 12), rng.randrange(4)
    text, body = [(f"the first {k} characters of the string s (all of s when it is shorter)", f"s[:{k}]"),
                  (f"the last {k} characters of the string s (all of s when it is shorter)", f"s[-{k}:]"),
                  (f"the string s without its first {k} characters", f"s[{k}:]"),
                  (f"the string s without its last {k} characters", f"s[:-{k}]")][which]
    return Spec("part(s)", f"returns {text}", f"return {body}", lambda r: [_letters(r, max_len=16)])


def extreme(rng: Random) -> Spec:
    k, which = rng.randint(0, 20), rng.choice(("largest", "smallest"))
    plus = f", plus {k}" if k else ""
    return Spec(f"{which}(xs)", f"returns the {which} number of the non-empty list xs{plus}",
                f"return {'max' if which == 'largest' else 'min'}(xs){f' + {k}' if k else ''}",
                lambda r: [_ints(r, min_len=1)])


# ---- level 2: a condition, or two operations ------------------------------------------------------------------
def sum_divisible(rng: Random) -> Spec:
    k, negate = rng.randint(2, 12), rng.random() < 0.5
    what = "not divisible" if negate else "divisible"
    return Spec("sum_divisible(xs)", f"returns the sum of the numbers of the list xs that are {what} by {k}",
                f"return sum(x for x in xs if x % {k} {'!=' if negate else '=='} 0)", lambda r: [_ints(r)])


def count_compared(rng: Random) -> Spec:
    t, greater = rng.randint(-5, 20), rng.random() < 0.5
    return Spec("count(xs)", f"returns how many numbers of the list xs are {'greater' if greater else 'less'} than {t}",
                f"return sum(1 for x in xs if x {'>' if greater else '<'} {t})", lambda r: [_ints(r, max_len=9)])


def replace_char(rng: Random) -> Spec:
    a, b = rng.sample(string.ascii_lowercase, 2)
    alphabet = a * 4 + "abcdefghij"
    return Spec("replace_char(s)", f"returns the string s with every '{a}' replaced by '{b}'",
                f"return s.replace('{a}', '{b}')", lambda r: [_letters(r, alphabet)])


def clamp(rng: Random) -> Spec:
    low, high = rng.randint(-10, 0), rng.randint(1, 20)
    return Spec("clamp(x)", f"returns x when it is between {low} and {high}, {low} when x is smaller than {low}, "
                            f"and {high} when x is larger than {high}",
                f"return min(max(x, {low}), {high})", lambda r: [r.randint(-30, 40)])


def quadratic(rng: Random) -> Spec:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return Spec("f(x)", f"returns x squared plus {a} times x minus {b}", f"return x * x + {a} * x - {b}",
                lambda r: [r.randint(-12, 12)])


def count_letters(rng: Random) -> Spec:
    letters = "".join(sorted(rng.sample(string.ascii_lowercase, 3)))
    alphabet = letters * 2 + "abcdefghijklmnop"
    return Spec("count_letters(s)", f"returns how many characters of the string s are one of the letters "
                                    f"'{letters[0]}', '{letters[1]}' or '{letters[2]}'",
                f"return sum(1 for c in s if c in '{letters}')", lambda r: [_letters(r, alphabet, max_len=12)])


# ---- level 3: a loop with state, or a rule in several parts ---------------------------------------------------
def digit_sum(rng: Random) -> Spec:
    k, c = rng.randint(1, 9), rng.randint(0, 9)
    times, plus = (f"{k} times " if k > 1 else ""), (f", plus {c}" if c else "")
    return Spec("digit_sum(n)", f"returns {times}the sum of the decimal digits of the non-negative integer n{plus}",
                f"return {f'{k} * ' if k > 1 else ''}sum(int(d) for d in str(n)){f' + {c}' if c else ''}",
                lambda r: [r.randint(0, 10 ** r.randint(1, 6))])


def fizz(rng: Random) -> Spec:
    a, word = rng.randint(2, 7), rng.choice(WORDS)
    return Spec("fizz(n)", f"returns the list of the numbers from 1 to n, each multiple of {a} replaced by the "
                           f"string '{word}'",
                f"return ['{word}' if i % {a} == 0 else i for i in range(1, n + 1)]", lambda r: [r.randint(0, 15)])


def caesar(rng: Random) -> Spec:
    k, forward = rng.randint(1, 25), rng.random() < 0.5
    way = "forward in the alphabet, wrapping around from 'z' to 'a'" if forward else \
        "back in the alphabet, wrapping around from 'a' to 'z'"
    return Spec("shift(s)", f"returns the string s of lowercase letters with every letter moved {k} places {way}",
                f"return ''.join(chr((ord(c) - ord('a') {'+' if forward else '-'} {k}) % 26 + ord('a')) for c in s)",
                lambda r: [_letters(r)])


def long_words(rng: Random) -> Spec:
    k, sep = rng.randint(3, 5), rng.choice((" ", ","))
    what, op = rng.choice((("more than", ">"), ("fewer than", "<"), ("exactly", "=="), ("at least", ">="),
                           ("at most", "<=")))
    where = "single spaces" if sep == " " else "commas"
    return Spec("count_words(s)", f"returns how many words of the string s (words separated by {where}) have "
                                  f"{what} {k} letters",
                f"return sum(1 for w in s.split('{sep}') if len(w) {op} {k})",
                lambda r: [sep.join(r.choice(WORDS) for _ in range(r.randint(1, 6)))])


def alternating_sum(rng: Random) -> Spec:
    k, c = rng.randint(1, 9), rng.randint(0, 9)
    times, plus = (f", multiplied by {k}" if k > 1 else ""), (f", then plus {c}" if c else "")
    return Spec("alternating(xs)", f"returns the sum of the numbers at even indices of the list xs minus the sum of "
                                   f"those at odd indices{times}{plus}",
                f"return (sum(xs[0::2]) - sum(xs[1::2])){f' * {k}' if k > 1 else ''}{f' + {c}' if c else ''}",
                lambda r: [_ints(r)])


def second(rng: Random) -> Spec:
    k, which = rng.randint(0, 20), rng.choice(("largest", "smallest"))
    plus = f", plus {k}" if k else ""
    return Spec("second(xs)", f"returns the second {which} distinct number of the list xs, which has at least two "
                              f"distinct numbers{plus}",
                f"return sorted(set(xs))[{-2 if which == 'largest' else 1}]{f' + {k}' if k else ''}",
                lambda r: (lambda xs: [xs if len(set(xs)) > 1 else xs + [max(xs) + 1]])(_ints(r, min_len=2)))


KINDS: dict[str, tuple[int, Callable[[Random], Spec]]] = {
    f.__name__: (level, f) for level, fs in (
        (1, (affine, each, count_char, ends, extreme)),
        (2, (sum_divisible, count_compared, replace_char, clamp, quadratic, count_letters)),
        (3, (digit_sum, fizz, caesar, long_words, alternating_sum, second)),
    ) for f in fs}
"""Every kind by name: (level, the kind's function)."""


def solution_of(spec: Spec) -> str:
    return f"def {spec.signature}:\n" + "".join(f"    {line}\n" for line in spec.body.splitlines())


def draw(kind: str, rng: Random, tests: int) -> Task:
    """One task of `kind`: its parameters and `tests` test cases drawn from `rng`, the expected values the
    reference solution's. The arguments are drawn again (up to 20 times) while every expected value is the same,
    so a program that returns a constant does not pass."""
    level, make = KINDS[kind]
    spec = make(rng)
    solution = solution_of(spec)
    namespace: dict[str, Any] = {}
    exec(compile(solution, f"<{kind}>", "exec"), namespace)          # our own reference, never a model's program
    fn_name = spec.signature.split("(")[0]
    reference = namespace[fn_name]
    for _ in range(20):
        inputs = [spec.args(rng) for _ in range(tests)]
        outputs = [reference(*args) for args in inputs]
        if tests == 1 or len({repr(out) for out in outputs}) > 1:
            break
    question = f"Write a Python function `{spec.signature}` that {spec.text}."
    return Task(kind, level, fn_name, question, solution, inputs, outputs)
