"""Atomic, unpickling-free checkpoints.

Layout: ``<output_dir>/checkpoints/step_<N>/`` with ``actor/`` and ``critic/`` (the workers' own
files: safetensors weights, weights-only optimizer tensors, JSON schedules), ``rng.safetensors``
(torch generators) and ``state.json`` (step, sampler, KL controller, tracker states, python and
numpy RNG). A checkpoint is written into a hidden temporary folder and renamed into place, so a
folder named ``step_<N>`` is always complete; a kill mid-save leaves only a temporary folder, which
the next start deletes.
"""

from __future__ import annotations

import difflib
import json
import os
import pickle
import random
import re
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..dist import barrier, is_distributed, is_rank0
from ..errors import CheckpointError, CheckpointMismatch, ConfigError, one_line

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def step_folder(path: Path, *roots: Path) -> Path:
    """`path`, or for a checkpoint named without the zero padding (`step_400`) the folder of that step
    (`step_000400`), looked for beside `path` and then in each of `roots`."""
    match = _STEP_DIR.match(path.name)
    if path.exists() or match is None:
        return path
    name = f"step_{int(match.group(1)):06d}"
    for folder in (path.parent, *roots):
        if (folder / name).is_dir():
            return folder / name
    return path


def clean_partial(root: Path) -> None:
    """Delete temporary folders left by a save that was killed."""
    if root.is_dir() and is_rank0():
        for p in root.glob(".tmp-*"):
            shutil.rmtree(p, ignore_errors=True)


def resume_target(mode: str, root: Path) -> Path | None:
    """The checkpoint `trainer.resume` names, changing nothing (--dry-run asks too): "auto" the newest
    complete one (None if there is none), "never" none (an error if the run directory already holds
    checkpoints), else that folder (an error naming the closest of auto / never if there is none)."""
    existing = complete_checkpoints(root)
    if mode == "never":
        if existing:
            raise CheckpointError(f"trainer.output_dir {root.parent} already holds checkpoints of an earlier run; "
                                  "use trainer.resume=auto to continue it, or pick another trainer.output_dir")
        return None
    if mode == "auto":
        return existing[-1] if existing else None
    path = step_folder(Path(mode), root)
    if not _is_dir(path):
        close = difflib.get_close_matches(mode, ["auto", "never"], n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise CheckpointError(f"trainer.resume = {mode!r} is not a folder; {hint}use auto, never or a checkpoint path")
    return path


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name the OS refuses (too long)
        return False


def find_resume(mode: str, root: Path) -> Path | None:
    """`resume_target`, after deleting what a killed save left; resuming an older checkpoint sets the
    newer ones aside."""
    clean_partial(root)
    path = resume_target(mode, root)
    if path is not None and mode not in ("auto", "never"):
        set_aside_newer(root, path)  # so pruning and a later resume=auto never mix the two timelines
    return path


def set_aside_newer(root: Path, resume_from: Path) -> None:
    """Resuming an older checkpoint of this run: rename its newer checkpoints to `abandoned-step_<N>`.

    They are kept (nothing is deleted), but no longer count as complete checkpoints, so keep-last-k
    pruning cannot delete the resumed timeline's own saves and `resume = "auto"` picks from it.
    """
    match = _STEP_DIR.match(resume_from.name)
    if match is None or not is_rank0():
        barrier()
        return
    for newer in complete_checkpoints(root):
        if int(_STEP_DIR.match(newer.name).group(1)) > int(match.group(1)):
            newer.rename(newer.with_name(f"abandoned-{newer.name}"))
            print(f"warning: trainer.resume = {resume_from}: set the newer {newer.name} aside as "
                  f"abandoned-{newer.name}", file=sys.stderr)
    barrier()


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    py = random.getstate()
    np_state = np.random.get_state()
    json_state = {"python": [py[0], list(py[1]), py[2]],
                  "numpy": [np_state[0], np_state[1].tolist(), *[x for x in np_state[2:]]]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = state
    return json_state, tensors


def set_rng_state(json_state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    py = json_state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, *rest = json_state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[f"cuda{i}"] for i in range(torch.cuda.device_count())
                                      if f"cuda{i}" in tensors])


def save_checkpoint(root: Path, step: int, workers, state: dict[str, Any], keep: int) -> Path:
    """Write step_<step> atomically, then keep only the newest `keep` checkpoints."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    broken = _nonfinite_worker(workers)
    if broken:
        previous = [p.name for p in complete_checkpoints(root)]
        kept = f"the newest complete checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(f"step {step}: the {broken}'s weights hold NaN or inf, so no checkpoint was written; "
                              f"{kept}; lower the learning rate and resume from it")
    try:
        if is_rank0():
            shutil.rmtree(tmp, ignore_errors=True)
            for part in ("actor", *(("critic",) if workers.critic is not None else ())):
                (tmp / part).mkdir(parents=True)                 # each worker writes into its own folder
        barrier()
        workers.actor.save(tmp / "actor")
        if workers.critic is not None:
            workers.critic.save(tmp / "critic")
        barrier()
        if is_rank0():
            json_state, tensors = rng_state()
            save_file(tensors, str(tmp / "rng.safetensors"))
            (tmp / "state.json").write_text(json.dumps({**state, "rng": json_state}))
            _fsync_tree(tmp)
            if final.exists():  # the same step saved by an earlier run that was not resumed from it
                _remove(final)
            os.replace(tmp, final)
            for old in complete_checkpoints(root)[:-keep]:
                _remove(old)
        barrier()
    # a full disk surfaces as OSError (from Python, and from torch.save via workers.save_tensors) or SafetensorError
    except (OSError, SafetensorError) as exc:
        if is_rank0():
            shutil.rmtree(tmp, ignore_errors=True)
        previous = [p.name for p in complete_checkpoints(root)]
        kept = f"the newest complete checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        detail = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200]
        raise CheckpointError(f"could not write checkpoint step {step} under {root} ({detail}); "
                              f"{kept}; free disk space or change trainer.output_dir, then rerun to resume") from None
    return final


def _remove(path: Path) -> None:
    """Delete a checkpoint folder by renaming it to a hidden temporary name first, so a kill mid-delete
    leaves a .tmp-* folder (deleted at the next start), never a partial step_<N> that looks complete."""
    trash = path.with_name(f".tmp-del-{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _nonfinite_worker(workers) -> str | None:
    """"actor" or "critic" if its weights hold NaN/inf (each rank checks its shard; ranks agree), else None."""
    for name, worker in (("actor", workers.actor), ("critic", workers.critic)):
        if worker is None:
            continue
        params = [p.to_local() if hasattr(p, "to_local") else p for p in worker.module.parameters()]
        if not params:
            continue
        bad = torch.stack([~torch.isfinite(p.detach()).all() for p in params]).any().float()
        if is_distributed():
            import torch.distributed as dist
            dist.all_reduce(bad)
        if bad.item():
            return name
    return None


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())


def read_tracker_states(path: Path) -> dict[str, Any]:
    """The trackers' saved states (read before the workers load, so trackers can start first)."""
    if not (path / "state.json").is_file():
        raise CheckpointError(f"trainer.resume: {path} is not a complete nanoverl checkpoint (no state.json); "
                              "name a checkpoints/step_<N> folder, or use resume=auto")
    return json.loads((path / "state.json").read_text()).get("trackers", {})


@contextmanager
def reading_checkpoint(path: Path):
    """What the disk and the formats raise while a checkpoint is read (and files that do not fit the
    model, CheckpointMismatch) becomes one CheckpointError naming the checkpoint; bugs propagate."""
    from safetensors import SafetensorError

    try:
        yield
    except pickle.UnpicklingError:  # weights_only torch.load met a pickled object that is not plain tensor data
        raise CheckpointError(f"checkpoint {path} holds pickled Python objects besides tensors, which nanoverl never "
                              "loads (unpickling can run arbitrary code); it was not written by nanoverl or was "
                              "tampered with; resume from another checkpoint or delete it") from None
    except (SafetensorError, OSError, EOFError, json.JSONDecodeError, CheckpointMismatch) as exc:
        detail = one_line(exc)
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({detail}); it is damaged, was not written by "
                              "nanoverl, or does not match this config; use another checkpoint "
                              "(trainer.resume=PATH) or delete it") from None


def find_checkpoint(path: Path, key: str, output_dir: str | Path | None = None) -> Path:
    """`path` itself if it is a complete checkpoint, else the newest complete one of the run directory `path`.
    `step_<N>` without zero padding finds step_<N:06d> beside it or in `output_dir`'s checkpoints."""
    path = step_folder(path, *([checkpoint_root(output_dir)] if output_dir else []))
    if (path / "state.json").is_file():
        return path
    found = complete_checkpoints(checkpoint_root(path))
    if not found:
        raise CheckpointError(f"{key} = {str(path)!r} is neither a checkpoint folder (checkpoints/step_<N>, with "
                              "state.json) nor a run directory with complete checkpoints; fix the path")
    return found[-1]


def load_checkpoint(path: Path, workers) -> dict[str, Any]:
    """Restore workers and RNG from a complete checkpoint; return the trainer state."""
    from safetensors.torch import load_file

    if not (path / "state.json").is_file():
        raise CheckpointError(f"trainer.resume: {path} is not a complete nanoverl checkpoint (no state.json); "
                              "name a checkpoints/step_<N> folder, or use resume=auto")
    if workers.critic is not None and not (path / "critic").is_dir():
        raise CheckpointError(f"trainer.resume: {path} has no critic but critic.enable = true; "
                              "resume with the config the run was started with")
    with reading_checkpoint(path):
        workers.actor.load(path / "actor")
        if workers.critic is not None:
            workers.critic.load(path / "critic")
        state = json.loads((path / "state.json").read_text())
        rng = load_file(str(path / "rng.safetensors"))
    set_rng_state(state.pop("rng"), rng)
    return state


def snapshot_run_dir(run_dir: Path) -> dict[Path, bytes | None] | None:
    """What a failed start must give back: None if the run directory does not exist, else each entry's
    path with, for a top-level file (config.json, metrics.jsonl: a start rewrites them), its bytes."""
    if not run_dir.is_dir():
        return None
    return {path: path.read_bytes() if path.is_file() and not path.is_symlink() else None
            for path in run_dir.iterdir()}


def remove_new_entries(run_dir: Path, before: dict[Path, bytes | None] | None) -> None:
    """Undo what a failed start wrote: the run directory itself if it did not exist (`before` None), else
    the entries that were not in `before`, and the earlier files it rewrote (config.json, metrics.jsonl)
    as they were. Checkpoints of an earlier run are never touched."""
    if before is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for path in set(run_dir.iterdir()) - set(before) if run_dir.is_dir() else ():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for path, content in before.items():
        if content is not None and (not path.is_file() or path.read_bytes() != content):
            tmp = path.with_name(f".restore-{path.name}")
            tmp.write_bytes(content)
            tmp.replace(path)


def changed_config(changed: list[str]) -> str:
    """What to say when a run directory's checkpoint does not load into a config that differs in `changed`."""
    keys = f"{', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}"
    return (f"the run directory's config.json (kept as it was) differs from this config in {keys}: rerun with those "
            "values to resume, or start fresh in a new trainer.output_dir")


def config_differences(run_dir: Path, config) -> list[str]:
    """The keys whose value differs between run_dir/config.json (an earlier run's) and `config`, dotted
    (`critic.enable`, `worker.debug.hidden_size`); [] when there is no earlier config or it is unreadable.
    Keys that say only how to run, not what is trained (trainer.resume, progress, the run length), aside."""
    try:
        old = json.loads((run_dir / "config.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    ignore = {"trainer.resume", "trainer.progress", "trainer.total_steps", "trainer.total_epochs",
              "trainer.save_every", "trainer.val_every", "trainer.keep_checkpoints", "trainer.num_threads",
              "trainer.device", "trainer.output_dir"}

    def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(tree, dict):
            return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): tree}
    before, now = flat(old), flat(config.to_dict())
    return sorted(k for k in before.keys() | now.keys() if k not in ignore and before.get(k) != now.get(k))


def write_run_config(run_dir: Path, config, registry) -> None:
    """run_dir/config.json: the resolved config and the version of every plugin (read by export)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"trainer.output_dir = {str(run_dir)!r} cannot be created ({exc.strerror}); "
                          "name a folder you can write to") from None
    tmp = run_dir / "config.json.tmp"
    tmp.write_text(json.dumps({"config": config.to_dict(), "plugins": registry.versions()}, indent=2))
    tmp.replace(run_dir / "config.json")
