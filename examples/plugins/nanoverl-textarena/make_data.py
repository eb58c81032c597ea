"""textarena games as nanoverl data rows: write train / validation JSONL, one row per (game, seed).

    python examples/plugins/nanoverl-textarena/make_data.py            # -> examples/plugins/nanoverl-textarena/data/
    python examples/plugins/nanoverl-textarena/make_data.py --check    # exit 1 unless the files are what it would write
    python .../make_data.py --games TowerOfHanoi-v0 --train 8 --val 2 --out DIR

A row is the game's start as a chat prompt, and what the `textarena` environment needs to replay it:

    {"data_source": "textarena/GuessTheNumber-v0",
     "prompt": [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "[GAME] You are Player 0. You are playing Guess The Number. ..."}],
     "extra_info": {"env_id": "GuessTheNumber-v0", "seed": 3}}

The user message is the game's first observation for that seed, as the environment renders it
(nanoverl_textarena.game, `--observation` as environment.textarena.observation), so the environment's
prompt check passes. Seeds: training rows take 0, 1, 2, ... and validation rows VAL_SEED, VAL_SEED + 1,
..., so no seed is in both files. A seed is a game only where the game draws its start from it:
GuessTheNumber-v0 has 20 secrets, so its validation seeds replay secrets the training rows have
(its prompt is the same for every seed); Mastermind-v0 (360 codes) and FrozenLake-v0 (a random lake)
rarely repeat. Rows are in a fixed order (game, then seed), so a re-run writes the same bytes.

textarena is pinned (pyproject.toml) because another version may draw other games from the same
seeds; `--check` says so by failing. Every game is built before anything is written: a game id
textarena does not know, a game it cannot build here (word games download nltk corpora at import, so
they need the network) or a multi-player game is an `error:` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.util import find_spec
from pathlib import Path

HERE = Path(__file__).resolve().parent
if find_spec("nanoverl_textarena") is None:         # run from a checkout without installing the plugin
    sys.path.insert(0, str(HERE / "src"))

from nanoverl_textarena.game import TextArenaEpisode  # noqa: E402
from nanoverl_textarena.settings import TextArenaSettings  # noqa: E402

GAMES = ["GuessTheNumber-v0", "Mastermind-v0", "FrozenLake-v0"]
TRAIN, VAL = 48, 16                                  # rows per game
VAL_SEED = 1_000_000
SYSTEM = ("You are playing a text game. Read the rules, then give your move as the only square-bracketed text "
          "of your reply, for example [5].")
OUT = HERE / "data"


def make_row(env_id: str, seed: int, observation: str = "new") -> dict:
    start = TextArenaEpisode(env_id, seed, TextArenaSettings(observation=observation))
    start.close()
    return {"data_source": f"textarena/{env_id}",
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": start.first_observation}],
            "extra_info": {"env_id": env_id, "seed": seed}}


def files(games: list[str] = GAMES, train: int = TRAIN, val: int = VAL, observation: str = "new") -> dict[str, str]:
    """{file name: its exact text}."""
    seeds = {"train.jsonl": range(train), "val.jsonl": range(VAL_SEED, VAL_SEED + val)}
    return {name: "".join(json.dumps(make_row(game, seed, observation)) + "\n" for game in games for seed in split)
            for name, split in seeds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--games", nargs="+", default=GAMES, help=f"textarena ids (default: {' '.join(GAMES)})")
    parser.add_argument("--train", type=int, default=TRAIN, help=f"training rows per game (default {TRAIN})")
    parser.add_argument("--val", type=int, default=VAL, help=f"validation rows per game (default {VAL})")
    parser.add_argument("--observation", choices=["new", "wrapped"], default="new",
                        help="as environment.textarena.observation (default new)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files differ")
    args = parser.parse_args(argv)
    try:
        texts = files(args.games, args.train, args.val, args.observation)
    except ValueError as exc:                        # an unknown, unbuildable or multi-player game
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = []
    for name, text in texts.items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_bytes() != text.encode():
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text.encode())
            print(f"wrote {path} ({text.count(chr(10))} rows)")
    if stale:
        print(f"differs from the generator (another textarena version?): {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
