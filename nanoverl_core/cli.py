"""`nanoverl-train`: train, validate a config (--dry-run), list plugins, evaluate, export.

    nanoverl-train [--config FILE] [section.key=value ...]     (no --config: the defaults plus the overrides)
    nanoverl-train [--config FILE] --dry-run [overrides]
    nanoverl-train plugins [--json]
    nanoverl-train eval [--config FILE] [--checkpoint DIR] [--json] [--samples FILE.jsonl] [overrides]
    nanoverl-train score [--config FILE] --responses FILE.jsonl [--json] [overrides]
    nanoverl-train translate [FILE | - | WORDS ...] [--toml]
    nanoverl-train export RUN_DIR_OR_CHECKPOINT OUT_DIR

Exit status: 0 success; 2 a user error (one `error:` line on stderr, no traceback); anything else is a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import json
import os
import shlex
import sys
import warnings
from pathlib import Path

from .config import load_config
from .errors import NanoverlDeprecation, UserError
from .plugins import load_registry


CONFIG_HELP = "TOML, YAML or JSON config file; without it, the defaults (docs/config.md) plus the overrides"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like every other user error
        raise UserError(f"{message}; run `{self.prog} --help` for usage")


class _Once(argparse.Action):
    """An option that may be given once: a second `--config` is refused (argparse would keep the last
    silently; merging two files is what overrides are for)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given twice ({getattr(namespace, self.dest)} and {values}); give one "
                         "file, and put what the other changes as section.key=value overrides after it")
        setattr(namespace, self.dest, values)


def _train_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nanoverl-train", description="Train a language model with RL (PPO, GRPO and relatives).",
                epilog="Other commands: `nanoverl-train plugins [--json]` lists installed plugins; "
                       "`nanoverl-train eval --config FILE [--checkpoint DIR]` evaluates a model; "
                       "`nanoverl-train score --config FILE --responses FILE.jsonl` scores given responses; "
                       "`nanoverl-train translate FILE` rewrites a verl command or a TRL GRPOConfig as nanoverl's "
                       "settings; `nanoverl-train export RUN_DIR_OR_CHECKPOINT OUT_DIR` writes a save_pretrained "
                       "folder.")
    p.add_argument("--config", action=_Once, help=CONFIG_HELP)
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
    args = _train_parser().parse_intermixed_args(argv)  # flags and overrides in any order
    registry = load_registry()
    config = load_config(args.config, args.overrides, registry=registry)
    if args.dry_run:
        from .trainer.resolve import describe
        print(json.dumps(describe(config, registry), indent=2))
        return 0
    from .dist import close_distributed, init_distributed
    from .trainer.trainer import Trainer
    init_distributed(config.trainer.device)  # under torchrun: join the process group; one process: no-op
    try:
        trainer = Trainer(config, registry)
        trainer.fit()
    finally:
        close_distributed()
    return 0


def cmd_eval(argv: list[str]) -> int:
    p = _Parser(prog="nanoverl-train eval", description="Evaluate the base model or a checkpoint on the config's "
                "validation data with its rollout (greedy, and sampled with rollout.val_n samples); writes nothing to the run.")
    p.add_argument("--config", action=_Once, help=CONFIG_HELP)
    p.add_argument("--checkpoint", type=Path, action=_Once, help="a checkpoints/step_<N> folder (step_400 finds "
                   "step_000400, also in trainer.output_dir's checkpoints) or a run directory (its newest)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--samples", type=Path, action=_Once, metavar="FILE.jsonl", help="also write every scored sample "
                   "(decoding, prompt, response, score, the data row with its ground truth) to this jsonl file")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="dotted config overrides")
    args = p.parse_intermixed_args(argv)  # flags and overrides in any order
    registry = load_registry()
    config = load_config(args.config, args.overrides, registry=registry, training=False)  # no training data needed
    from .trainer.commands import run_eval
    from .trainer.validation import format_eval
    with stdout_to_stderr() if args.json else contextlib.nullcontext():  # --json: stdout holds the JSON alone
        report = run_eval(config, registry, args.checkpoint, args.samples)
    print(json.dumps(report, indent=2) if args.json else format_eval(report))
    return 0


@contextlib.contextmanager
def stdout_to_stderr():
    """File descriptor 1 goes to stderr while the block runs, for this process and every process it starts
    (vLLM's engine core logs to stdout), so what the command prints after it is all that stdout holds."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def cmd_score(argv: list[str]) -> int:
    p = _Parser(prog="nanoverl-train score", description="Score given responses with the config's [reward], as "
                "validation scores them, and print each reward's extra keys per response; loads no model.")
    p.add_argument("--config", action=_Once, help=CONFIG_HELP)
    p.add_argument("--responses", type=Path, action=_Once, required=True, metavar="FILE.jsonl",
                   help="one JSON object a line: the data row's columns (ground truth, ...) and \"response\", "
                   "or a line of `eval --samples`")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="dotted config overrides")
    args = p.parse_intermixed_args(argv)
    registry = load_registry()
    config = load_config(args.config, args.overrides, registry=registry, training=False)
    from .trainer.commands import format_score, run_score
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        report = run_score(config, registry, args.responses)
    print(json.dumps(report, indent=2) if args.json else format_score(report))
    return 0


def cmd_translate(argv: list[str]) -> int:
    p = _Parser(prog="nanoverl-train translate", description="Rewrite a verl command line (python3 -m "
                "verl.trainer.main_ppo key=value ...) or a TRL GRPOConfig(...) call as nanoverl's settings: "
                "overrides (or --toml), with what has no nanoverl setting listed after them.")
    p.add_argument("source", nargs="*", metavar="FILE | - | WORDS",
                   help="a file holding the command or the Python with the GRPOConfig call, - for stdin, or the "
                   "command's words themselves (after --)")
    p.add_argument("--toml", action="store_true", help="print a TOML config instead of overrides")
    args = p.parse_args(argv)
    if not args.source:
        raise UserError("translate needs what to translate: a file holding the verl command or the GRPOConfig(...) "
                        "call, - to read it from stdin, or the command's words after --")
    if args.source == ["-"]:
        text = sys.stdin.read()
    elif len(args.source) == 1 and Path(args.source[0]).is_file():
        text = Path(args.source[0]).read_text(encoding="utf-8", errors="replace")
    elif len(args.source) == 1 and "=" not in args.source[0] and "(" not in args.source[0]:
        raise UserError(f"translate: {args.source[0]} is not a file; name a file holding the command or the "
                        "GRPOConfig(...) call, - for stdin, or pass the command's words after --")
    else:
        text = " ".join(map(shlex.quote, args.source))  # the words as the shell passed them
    from .config.load import _field_type
    from .translate import as_overrides, as_toml, parse_foreign, translate
    whose, values = parse_foreign(text)
    if not values:
        raise UserError("translate: found no key=value words and no GRPOConfig(...) call; pass a verl command line "
                        "or the Python that builds a TRL GRPOConfig")
    registry = load_registry()
    result = translate(whose, values, known=lambda path: _field_type(path.split("."), registry) is not None)
    lines = [f"# {whose}: {len(values)} settings, {len(result.settings)} nanoverl settings"
             + (f" (TRL's defaults assumed: {', '.join(result.assumed)})" if result.assumed else "")]
    if args.toml:
        lines.append(as_toml(result.settings).rstrip())
    else:
        lines += ["nanoverl-train \\"] + [f"    {override} \\" for override in as_overrides(result.settings)]
        lines[-1] = lines[-1].removesuffix(" \\")
    lines += [f"# not mapped: {item}: {why}" for item, why in result.unmapped]
    print("\n".join(lines))
    return 0


def cmd_export(argv: list[str]) -> int:
    p = _Parser(prog="nanoverl-train export", description="Write a checkpoint's policy as a plain save_pretrained "
                "folder (weights, config, tokenizer) that transformers and vLLM load.")
    p.add_argument("source", type=Path, metavar="RUN_DIR_OR_CHECKPOINT",
                   help="a run directory (its newest checkpoint) or a checkpoints/step_<N> folder")
    p.add_argument("out", type=Path, metavar="OUT_DIR", help="a new (or empty) folder")
    args = p.parse_args(argv)
    from .trainer.commands import run_export
    print(f"wrote {run_export(args.source, args.out, load_registry())}")
    return 0


COMMANDS = {"plugins": cmd_plugins, "eval": cmd_eval, "score": cmd_score, "translate": cmd_translate,
            "export": cmd_export}


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """A renamed plugin-API name in use (NanoverlDeprecation): one `warning:` line; other warnings as Python shows them."""
    if issubclass(category, NanoverlDeprecation):
        print(f"warning: {message} (at {filename}:{lineno})", file=sys.stderr)
    else:
        _default(message, category, filename, lineno, file, line)


def check_command(word: str) -> None:
    """A first argument that is neither an option, an override nor a command: a misspelt command
    (`evl`) gets the closest one, a config file named without --config gets that hint."""
    if word.startswith("-") or "=" in word or word in COMMANDS:
        return
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    hint = (f"did you mean `nanoverl-train {close[0]}`?" if close else
            f"a config file goes after --config (`nanoverl-train --config {word}`)" if Path(word).suffix else
            "an override looks like section.key=value")
    raise UserError(f"unknown command {word!r}; {hint} (the commands: {', '.join(COMMANDS)}; "
                    "without one, nanoverl-train trains)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warnings.showwarning = _show_warning
    try:
        if argv[:1] and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        if argv:
            check_command(argv[0])
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
