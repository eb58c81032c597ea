"""A one-off environment with a tool, in one file: the tiny model dials a 4-digit code and answers with
the number the phone book files under it.

    nanoverl-train --config examples/configs/tiny_tool.toml      # [environment] file = this file

`lookup` is the tool: a plain function. An episode has two model turns. The first dials: its text goes
to `lookup`, and the number comes back, followed by "=" (so the number reads like one of the copy
task's prompts). The second turn is the answer. The book is a fixed random permutation of 0000-9999:
no model can work a number out from its code, so on codes never trained on (the validation rows) only
a model that dials and reads the answer back scores. Rewards: half for the digits dialed right (a
model learning from scratch must learn to dial before it can read anything back), half for the
answer's digits, less 0.05 for a turn that does not end with EOS (the turn's text drops special
tokens, so without it "4831<bos>" would pass for "4831<eos>"). Nothing here needs a package or a
plugin: nanoverl imports this file in its environment worker processes, one `PhoneCall` per episode.
"""

import random

from nanoverl_core.env import EnvStep, Turn

BOOK = dict(zip((f"{i:04d}" for i in range(10_000)),
                (f"{i:04d}" for i in random.Random(0).sample(range(10_000), 10_000))))


def lookup(code: str) -> str:
    """The number filed under a 4-digit code; a KeyError for anything else."""
    return BOOK[code]


def share(text: str, target: str) -> float:
    """The fraction of positions where `text` matches `target`, over the longer of the two (char_match)."""
    return sum(a == b for a, b in zip(text, target)) / max(len(text), len(target), 1)


class PhoneCall:
    def __init__(self, code: str, number: str):
        self.code, self.number = code, number     # one object per episode: its state lives here

    def step(self, turn: Turn) -> EnvStep:
        text, unended = turn.text.strip(), 0.05 * turn.truncated
        if turn.index == 1:                       # the answer
            return EnvStep(reward=share(text, self.number) / 2 - unended, done=True)
        try:
            heard = lookup(text) + "="
        except KeyError:                          # not a code: nothing comes back, the model answers blind
            heard = ""
        return EnvStep(observation=heard, reward=share(text, self.code) / 2 - unended,
                       info={"dialed_right": float(text == self.code)})


def make_env(sample: dict) -> PhoneCall:
    """One episode from its data row: {"prompt": "4831=", "target": <the number filed under 4831>}."""
    return PhoneCall(sample["prompt"].rstrip("="), sample["target"])
