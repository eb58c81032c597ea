"""The console and jsonl trackers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..config import Config

_SHOWN = ("reward/mean", "val/reward/mean", "actor/pg_loss", "critic/vf_loss", "rollout/response_length/mean")


class ConsoleTracker:
    """A progress bar with step, reward and time left on a terminal; one plain line per step otherwise."""

    def __init__(self, config: Config, run_dir: Path, state: dict | None):
        self.trainer = config.trainer  # total_steps is read at each step: trainer.total_epochs sets it after loading
        mode = config.trainer.progress
        self.bar = mode == "bar" or (mode == "auto" and sys.stdout.isatty())
        self.quiet = mode == "none"
        self.start, self.first_step = time.monotonic(), None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.quiet:
            return
        total = self.trainer.total_steps or step
        if self.first_step is None:
            self.first_step = step - 1
        done = step - self.first_step
        left = (time.monotonic() - self.start) / done * (total - step)
        shown = " ".join(f"{k}={metrics[k]:.4g}" for k in _SHOWN if k in metrics)
        if self.bar:
            filled = int(30 * step / total)
            sys.stdout.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {step}/{total} {shown} "
                             f"left {left:.0f}s\x1b[K")
            if step == total:
                sys.stdout.write("\n")
        else:
            sys.stdout.write(f"step {step}/{total} {shown} time_left={left:.0f}s\n")
        sys.stdout.flush()

    def log_samples(self, name: str, rows: list[dict], step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def close(self, success: bool) -> None:
        if self.bar:
            sys.stdout.write("\n")


class JsonlTracker:
    """Appends one JSON object per step to metrics.jsonl. On resume from step N, lines after N
    (written before the kill and about to be replayed) are dropped first."""

    def __init__(self, config: Config, run_dir: Path, state: dict | None):
        self.path = run_dir / "metrics.jsonl"
        last = (state or {}).get("step", 0) if state is not None else 0
        kept = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
                if row.get("step", 0) <= last:
                    kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)
        self.file = self.path.open("a")
        self.last_step = last

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()
        self.last_step = step

    def log_samples(self, name: str, rows: list[dict], step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"step": self.last_step}

    def close(self, success: bool) -> None:
        self.file.close()
