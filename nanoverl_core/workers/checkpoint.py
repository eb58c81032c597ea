"""Checkpoint I/O of a worker: the single-process format's file names in one place, and how tensors are
written and read.

A single-process worker's folder (`checkpoints/step_<N>/actor/`, `critic/`; the `SingleProcess`
strategy writes it) holds its weights (`MODEL_FILE`, safetensors; with LoRA weights peft's adapter
file instead, nanoverl_hf.lora), its optimizer state (`OPTIMIZER_FILE`, a weights-only torch.save)
and its learning-rate schedule (`SCHEDULER_FILE`, JSON). A sharded FSDP worker writes one file per
rank instead, named in nanoverl_fsdp.checkpoint; it reuses the tensor and schedule I/O here.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointMismatch, UserError

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.json"


def save_optimizer(path: Path, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """The optimizer's state and the schedule into the folder `path` (a single process's whole state)."""
    save_tensors(optimizer.state_dict(), path / OPTIMIZER_FILE)
    save_scheduler(path, scheduler)


def load_optimizer(path: Path, optimizer: torch.optim.Optimizer, scheduler, device: torch.device | str) -> None:
    """What save_optimizer wrote (call it inside `checkpoint_fits`)."""
    optimizer.load_state_dict(load_tensors(path / OPTIMIZER_FILE, device))
    load_scheduler(path, scheduler)


def save_scheduler(path: Path, scheduler) -> None:
    (path / SCHEDULER_FILE).write_text(json.dumps(scheduler.state_dict()))


def load_scheduler(path: Path, scheduler) -> None:
    scheduler.load_state_dict(json.loads((path / SCHEDULER_FILE).read_text()))


def save_tensors(obj: Any, path: Path) -> None:
    """torch.save of plain tensors / numbers / strings; a failed write (a full disk) is raised as the
    OSError it is (torch reports it as a RuntimeError)."""
    try:
        torch.save(obj, path)
    except RuntimeError as exc:
        raise OSError(errno.EIO, f"writing {path.name} failed ({' '.join(str(exc).split())[:200]})", str(path)) from None


def load_tensors(path: Path, device: torch.device | str = "cpu") -> Any:
    """torch.load(weights_only=True): tensors and plain values only, nothing is unpickled."""
    return torch.load(path, weights_only=True, map_location=device)


class checkpoint_fits:
    """A context manager around applying checkpoint files to modules and optimizers: what
    load_state_dict raises for tensors or state that do not fit (and torch.load for a file that is not
    a zip archive) becomes CheckpointMismatch, which the trainer reports as a user error. Anything
    raised outside such a block is a bug and propagates as one."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None and issubclass(kind, (RuntimeError, ValueError, KeyError)) \
                and not issubclass(kind, (UserError, CheckpointMismatch)):
            raise CheckpointMismatch(f"{kind.__name__}: {exc}") from None
        return False
