"""The offline commands: `nanoverl-train eval`, `score` and `export`. None writes to a run.

    eval    the base model (or a checkpoint's policy) on the config's validation data with the
            config's rollout: greedy, and sampled at rollout.temperature with rollout.val_n samples
            per prompt (mean@n and best@n), overall and per data source.
    score   responses given in a jsonl file, scored by the config's [reward] as validation scores
            them, with every reward's extra keys per row; no model is loaded.
    export  a checkpoint (or a run's newest) as a plain save_pretrained folder, through the run's
            worker: its factory's `export_checkpoint(checkpoint, out, config)` (hf and fsdp have one).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import attrs
import torch

from ..config import Config, TeacherConfig, config_from_dict, drop_moved_keys
from ..config.domains import unwritable
from ..data import load_split
from ..dist import is_rank0
from ..errors import CheckpointError, ConfigError, DataError
from ..plugins import Registry
from ..workers.precision import resolve_compute_dtype
from .checkpoint import find_checkpoint, reading_checkpoint
from .resolve import build_rollout, build_workers, prompt_tools, resolve_plugins
from .validation import eval_decodings, sample_detail


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
    workers = build_workers(plugins, attrs.evolve(config, teacher=TeacherConfig()))   # eval reads no teacher
    rollout = build_rollout(plugins, config, workers)
    try:
        if ckpt is not None:
            with reading_checkpoint(ckpt):
                workers.actor.load(ckpt / "actor")
            rollout.sync_weights(workers.actor)
        data = load_split(plugins["data_source"](config), "val", config.data, workers.tokenizer,
                          tools=prompt_tools(plugins, workers.tokenizer))
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


def response_lines(path: Path, hint: str) -> list[dict]:
    """The JSON objects of a jsonl file of responses, each with "response" text (`eval --samples` writes
    one); a line that is not such an object is a DataError naming the file and line, then `hint`."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number} is not JSON ({exc.msg}); {hint}") from None
        if not isinstance(item, dict) or not isinstance(item.get("response"), str):
            raise DataError(f"{path}:{number} has no \"response\" text; {hint}")
        out.append(item)
    return out


def read_responses(path: Path, prompt_key: str) -> list[tuple[str, str, dict]]:
    """(prompt text, response, data row) of each line of a responses file: a JSON object with "response"
    and the data row's columns beside it, or under "row" (what `eval --samples` writes). The prompt is the
    line's "prompt" text, or a chat row's messages' contents joined with newlines (no tokenizer is loaded)."""
    if not path.is_file():
        raise ConfigError(f"--responses {path} does not exist; name a jsonl file of objects with a \"response\"")
    out = []
    for item in response_lines(path, "each line is a data row with the response to score under \"response\" "
                                     "(or an `eval --samples` line)"):
        row = item["row"] if isinstance(item.get("row"), dict) else {k: v for k, v in item.items() if k != "response"}
        prompt = item.get("prompt", row.get(prompt_key, ""))
        if isinstance(prompt, list):
            prompt = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
        out.append((str(prompt), item["response"], row))
    if not out:
        raise DataError(f"{path} holds no responses; write one JSON object a line")
    return out


def run_score(config: Config, registry: Registry, responses: Path) -> dict[str, Any]:
    """{"reward", "responses", "rows": [{"index", "score", "extras", "error"?}], "metrics"}: each response of
    the file scored by [reward] as validation scores it (the overlong penalty of training needs token
    counts and is not applied); a failed call scores 0 and says why in its row (reward.on_error = "zero")."""
    from ..batch import RLBatch
    from ..reward import ByteTokenizer, RewardScorer, as_responses

    items = read_responses(responses, config.data.prompt_key)
    rows = [row for _, _, row in items]
    batch = RLBatch({}, {"prompt_text": [prompt for prompt, _, _ in items], "row": rows,
                         "index": list(range(len(items))),
                         "data_source": [str(row.get(config.data.data_source_key, "default")) for row in rows]})
    scorer = RewardScorer(attrs.evolve(config.reward, on_error="zero"), registry, prompt_key=config.data.prompt_key)
    try:
        scored, metrics = scorer.score_batch(as_responses(batch, [response for _, response, _ in items]),
                                             ByteTokenizer(), phase="score")
    finally:
        scorer.close()
    scores, details = scored["score"], scored["reward_detail"]
    metrics = {"reward/mean": metrics.pop("reward/mean"), **metrics}
    metrics.pop("reward/std")
    return {"reward": scorer.label, "responses": str(responses), "metrics": metrics,
            "rows": [{"index": i, "score": float(score), **sample_detail(detail)}
                     for i, (score, detail) in enumerate(zip(scores.tolist(), details))]}


def format_score(report: dict[str, Any]) -> str:
    """A score report as one line per response (its score, then each extra key) and the means."""
    def short(key: str) -> str:  # reward/compile_error -> compile_error, reward/<name>/mean -> <name>
        return key.removeprefix("reward/").removesuffix("/mean")

    lines = [f"{len(report['rows'])} responses of {report['responses']} scored by reward {report['reward']}",
             f"{'row':>5} {'score':>8}  extras"]
    for row in report["rows"]:
        extras = [f"{short(k)}={v:g}" for k, v in row.get("extras", {}).items()]
        error = [f"error: {row['error']}"] if "error" in row else []
        lines.append("  ".join([f"{row['index']:>5} {row['score']:>8.4f}", " ".join(extras), *error]).rstrip())
    means = " ".join(f"{short(k)}={v:.4g}" for k, v in report["metrics"].items()
                     if k != "reward/mean" and (v or k not in ("reward/errors", "reward/timeouts", "reward/crashes")))
    lines.append(f"{'mean':>5} {report['metrics']['reward/mean']:>8.4f}  {means}".rstrip())
    return "\n".join(lines)


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
