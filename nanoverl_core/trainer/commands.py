"""The offline commands: `nanoverl-train eval` and `nanoverl-train export`. Neither writes to a run.

    eval    the base model (or a checkpoint's policy) on the config's validation data with the
            config's rollout: greedy, and sampled at rollout.temperature with rollout.val_n samples
            per prompt (mean@n and best@n), overall and per data source.
    export  a checkpoint (or a run's newest) as a plain save_pretrained folder, through the run's
            worker: its factory's `export_checkpoint(checkpoint, out, config)` (hf and fsdp have one).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..config import Config, config_from_dict, drop_moved_keys
from ..config.domains import unwritable
from ..data import load_split
from ..dist import is_rank0
from ..errors import CheckpointError, ConfigError
from ..plugins import Registry
from ..workers.precision import resolve_compute_dtype
from .checkpoint import find_checkpoint, reading_checkpoint
from .resolve import build_rollout, build_workers, prompt_tools, resolve_plugins
from .validation import eval_decodings


def run_eval(config: Config, registry: Registry, checkpoint: Path | None = None,
             samples: Path | None = None) -> dict[str, Any]:
    """{"model", "checkpoint", "prompts", "results": {decoding: metrics}} for the base model or `checkpoint`.
    With `samples`, every scored sample also goes to that jsonl file, one object a line: decoding, index,
    data_source, prompt, response, score and the data row (its ground truth), for scripts/compare_scorers.py."""
    if config.data.source == "files" and not config.data.val_files:
        raise ConfigError("data.val_files is empty; eval scores the config's validation prompts, name at least one file")
    problem = unwritable(samples, "file") if samples is not None else None
    if problem:
        raise ConfigError(f"--samples {samples} cannot be written: {problem}; name another file")
    if samples is not None and not samples.parent.is_dir():
        raise ConfigError(f"--samples {samples}: the folder {samples.parent} does not exist; create it or name "
                          "another file")
    ckpt = find_checkpoint(checkpoint, "--checkpoint", config.trainer.output_dir) if checkpoint is not None else None
    resolve_compute_dtype(config)
    plugins = resolve_plugins(config, registry)
    plugins["reward"].errors_path = None  # eval writes nothing: failed reward calls are only counted
    torch.manual_seed(config.trainer.seed)
    if config.trainer.num_threads:
        torch.set_num_threads(config.trainer.num_threads)
    workers = build_workers(plugins, config)
    rollout = build_rollout(plugins, config, workers)
    try:
        if ckpt is not None:
            with reading_checkpoint(ckpt):
                workers.actor.load(ckpt / "actor")
            rollout.sync_weights(workers.actor)
        data = load_split(plugins["data_source"](config), "val", config.data, workers.tokenizer,
                          tools=prompt_tools(plugins))
        if data is None:
            raise ConfigError(f"data.source = {config.data.source!r} gives no validation rows; eval scores the "
                              f"validation prompts: set its validation size in [data.{config.data.source}]")
        rows: list[dict] | None = [] if samples is not None else None
        results = eval_decodings(config, rollout, workers.tokenizer, plugins["reward"], data, rows,
                                 show_progress=is_rank0())
        if samples is not None and is_rank0():  # every rank holds every score (gathered); one writes them
            samples.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    finally:
        rollout.close()
        plugins["reward"].close()
    return {"model": config.model.path or config.worker.name, "checkpoint": str(ckpt) if ckpt else None,
            "prompts": len(data), "results": results}


def run_export(source: Path, out: Path, registry: Registry) -> Path:
    """Write the policy of `source` (a checkpoint, or a run directory's newest) to the new folder `out`."""
    problem = unwritable(out, "folder") or unwritable(out.with_name(f".tmp-{out.name}"), "folder")
    if problem:
        raise ConfigError(f"OUT_DIR {out} cannot be created: {problem}; name a new folder")
    ckpt = find_checkpoint(source, "RUN_DIR_OR_CHECKPOINT")
    run_config = ckpt.parent.parent / "config.json"
    if not run_config.is_file():
        raise CheckpointError(f"{ckpt} has no {run_config} beside its checkpoints/ folder; export needs the run's "
                              "config.json (written by nanoverl-train at the start of the run)")
    try:
        data = json.loads(run_config.read_text())["config"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise CheckpointError(f"{run_config} is not a nanoverl run config (no 'config' mapping)") from None
    config = config_from_dict(drop_moved_keys(data), registry=registry)  # a run from before a key moved
    factory = registry.get("worker", config.worker.name, key="worker.name")
    exporter = getattr(factory, "export_checkpoint", None)
    if exporter is None:
        raise ConfigError(f"the run's worker.name = {config.worker.name!r} has no export to a save_pretrained folder "
                          "(its model is not a transformers model); its checkpoint holds plain safetensors weights")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"OUT_DIR {out} already exists and is not an empty folder; name a new folder")
    tmp = out.with_name(f".tmp-{out.name}")                     # a complete folder or none, like checkpoints
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with reading_checkpoint(ckpt):
            exporter(ckpt, tmp, config)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
