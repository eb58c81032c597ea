"""`nanoverl-train`: train, validate a config (--dry-run), or list plugins.

    nanoverl-train --config FILE [section.key=value ...]
    nanoverl-train --config FILE --dry-run [overrides]
    nanoverl-train plugins [--json]

Exit status: 0 success; 2 a user error (one `error:` line on stderr, no traceback); anything else is a bug.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from .config import load_config
from .errors import UserError
from .plugins import load_registry


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other user error
        raise UserError(f"{message}; run `{self.prog} --help` for usage")


def _train_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nanoverl-train", description="Train a language model with RL (PPO, GRPO and relatives).",
                epilog="Other command: `nanoverl-train plugins [--json]` lists installed plugins.")
    p.add_argument("--config", required=True, help="TOML, YAML or JSON config file")
    p.add_argument("--dry-run", action="store_true",
                   help="validate the config, resolve every plugin name, print the resolved config; load no model")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="dotted config overrides")
    return p


def cmd_plugins(argv: list[str]) -> int:
    p = _Parser(prog="nanoverl-train plugins", description="List installed plugins and the names they provide.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    args = p.parse_args(argv)
    registry = load_registry()
    if args.json:
        print(json.dumps([info.to_dict() for info in registry.plugins], indent=2))
        return 0
    for info in registry.plugins:
        print(f"{info.dist} {info.version}  ({info.module})")
        if info.error:
            print(f"  IMPORT ERROR: {info.error}  (disable with NANOVERL_DISABLE_PLUGINS={info.dist})")
        for kind, names in info.names.items():
            print(f"  {kind}: {', '.join(names)}")
            for name in names:
                description = info.descriptions.get(kind, {}).get(name, "")
                print(f"    {name}" + (f" - {description}" if description else ""))
    return 0


def cmd_train(argv: list[str]) -> int:
    args = _train_parser().parse_args(argv)
    registry = load_registry()
    config = load_config(args.config, args.overrides, registry=registry)
    if args.dry_run:
        from .trainer.resolve import describe
        print(json.dumps(describe(config, registry), indent=2))
        return 0
    from .trainer.dist import close_distributed, init_distributed
    from .trainer.trainer import Trainer
    init_distributed(config.trainer.device)  # under torchrun: join the process group; one process: no-op
    try:
        trainer = Trainer(config, registry)
        trainer.fit()
    finally:
        close_distributed()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["plugins"]:
            return cmd_plugins(argv[1:])
        return cmd_train(argv)
    except UserError as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message held
        print(f"error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `nanoverl-train plugins | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silence the flush at exit
        return 141  # 128 + SIGPIPE, as shells report it
    except OSError as exc:  # a full disk or a read-only / forbidden folder is the user's to fix, not a bug
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES):
            raise
        print(f"error: {exc.strerror}: {exc.filename or 'a file of the run'}; free disk space or fix the "
              "folder's permissions, then rerun (a run resumes from its newest checkpoint)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume from the newest checkpoint", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
