"""Export a sharded fsdp checkpoint as a plain transformers model folder (`save_pretrained` layout).

    python -m nanoverl_fsdp.export RUN_DIR                 # newest checkpoint -> RUN_DIR/final_model
    python -m nanoverl_fsdp.export CHECKPOINT OUT          # checkpoints/step_<N> -> OUT

Runs in one ordinary process (no torchrun, no GPU): torch.distributed.checkpoint reads every rank's
shards of the actor into the state dict of a model rebuilt from the checkpoint's `actor/hf/` config,
which is then saved with its tokenizer. The result loads with `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ACTOR_DIR, HF_FILES = "actor", "hf"


class ExportError(Exception):
    """A path that is not an fsdp run or checkpoint."""


def find_checkpoint(path: Path) -> tuple[Path, Path]:
    """(checkpoint folder, default output folder) for a run directory or a checkpoint folder."""
    if (path / ACTOR_DIR / HF_FILES).is_dir():
        return path, path.parent.parent / "final_model"
    steps = sorted((p for p in (path / "checkpoints").glob("step_*") if (p / ACTOR_DIR / HF_FILES).is_dir()),
                   key=lambda p: int(p.name.split("_")[1]))
    if not steps:
        raise ExportError(f"{path} is neither an fsdp checkpoint (no {ACTOR_DIR}/{HF_FILES}/) nor a run directory "
                          "with complete fsdp checkpoints under checkpoints/; train with worker.name=fsdp first")
    return steps[-1], path / "final_model"


def export(checkpoint: str | Path, out: str | Path | None = None) -> Path:
    """Write the policy of `checkpoint` (a checkpoint or run folder) to `out`; returns `out`."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ckpt, default_out = find_checkpoint(Path(checkpoint))
    out = Path(out) if out else default_out
    hf = ckpt / ACTOR_DIR / HF_FILES
    config = AutoConfig.from_pretrained(hf)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(config, "dtype", None) or torch.float32)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():                         # "no process group: loading in one process" is the plan
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(ckpt / ACTOR_DIR))   # reads every rank's shards
    model.load_state_dict(state["model"])
    model.generation_config = GenerationConfig.from_pretrained(hf)
    model.config.use_cache = True                           # training turned the KV cache off; generation wants it

    tmp = out.with_name(f".tmp-{out.name}")                 # a complete folder or none, like checkpoints
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(hf).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanoverl_fsdp.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a run directory (its newest checkpoint) or a checkpoints/step_<N> folder")
    parser.add_argument("out", nargs="?", help="output folder (default: <run directory>/final_model)")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
