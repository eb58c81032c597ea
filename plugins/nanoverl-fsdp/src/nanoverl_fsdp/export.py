"""Export a sharded fsdp checkpoint as a plain transformers model folder (`save_pretrained` layout).

    python -m nanoverl_fsdp.export RUN_DIR                 # newest checkpoint -> RUN_DIR/final_model
    python -m nanoverl_fsdp.export CHECKPOINT OUT          # checkpoints/step_<N> -> OUT

Runs in one ordinary process (no torchrun, no GPU): every rank's `model_rank<r>.safetensors` shards
of the actor are joined along the dims `shards.json` names into the state dict of a model rebuilt from
the checkpoint's `actor/hf/` config, which is then saved with its tokenizer (the format and its file
names: checkpoint.py). Nothing is unpickled.
The result loads with `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .checkpoint import HF_FILES, MODEL_FILE, SHARDS

ACTOR_DIR = "actor"


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


def full_state_dict(actor: Path) -> dict:
    """The whole state dict of a saved fsdp actor: each entry's rank shards concatenated in rank order."""
    import torch
    from safetensors.torch import load_file

    shards = json.loads((actor / SHARDS).read_text())
    ranks = [load_file(str(actor / MODEL_FILE.format(rank=r))) for r in range(shards["world_size"])]
    state = {}
    for name, entry in shards["model"].items():
        dim = entry["shard_dim"]
        state[name] = ranks[0][name] if dim is None else torch.cat([rank[name] for rank in ranks], dim)
        if list(state[name].shape) != entry["shape"]:
            raise ExportError(f"{actor}: the shards of {name} join to {list(state[name].shape)}, not {entry['shape']}")
    return state


def export(checkpoint: str | Path, out: str | Path | None = None, run_config=None) -> Path:
    """Write the policy of `checkpoint` (a checkpoint or run folder) to `out`; returns `out`. A LoRA
    checkpoint (adapter shards only) needs the run's config (`run_config`): the base comes from model.path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    ckpt, default_out = find_checkpoint(Path(checkpoint))
    out = Path(out) if out else default_out
    hf = ckpt / ACTOR_DIR / HF_FILES
    if json.loads((ckpt / ACTOR_DIR / SHARDS).read_text()).get("lora"):
        if run_config is None or not run_config.model.lora.enable:
            raise ExportError(f"{ckpt} holds a LoRA adapter, not the whole policy; export it with "
                              "`nanoverl-train export RUN_DIR OUT_DIR`, which rebuilds the base from the run's model.path")
        from nanoverl_hf.export import merged_lora_policy
        from nanoverl_hf.models import load_policy, resolve_source

        model = load_policy(run_config, resolve_source(run_config.model))
        model = merged_lora_policy(model, ckpt / ACTOR_DIR, run_config, module_state=full_state_dict(ckpt / ACTOR_DIR))
    else:
        config = AutoConfig.from_pretrained(hf)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(config, "dtype", None) or torch.float32)
        model.load_state_dict(full_state_dict(ckpt / ACTOR_DIR))
    model.generation_config = GenerationConfig.from_pretrained(hf)
    model.config.use_cache = True                           # training turned the KV cache off; generation wants it

    tmp = out.with_name(f".tmp-{out.name}")                 # a complete folder or none, like checkpoints
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(hf).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def export_checkpoint(checkpoint: Path, out: Path, config=None) -> None:
    """What `nanoverl-train export` calls for the fsdp worker (the shards carry their own config)."""
    try:
        export(checkpoint, out, config)
    except ExportError as exc:
        from nanoverl_core.errors import CheckpointError
        raise CheckpointError(str(exc)) from None


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
