"""The ``tensorboard`` tracker: the run's metrics as TensorBoard scalars, each step once after a resume.

Selected by ``tracking.trackers = [..., "tensorboard"]``; needs ``pip install "nanoverl[tensorboard]"``.
Only this module imports tensorboard, and only when "tensorboard" is selected.

The writer is torch's ``torch.utils.tensorboard.SummaryWriter`` (torch is already a core dependency; it
needs the ``tensorboard`` package, which also reads the files back and serves the UI). It is the writer
verl's and transformers' TensorBoard loggers use, so the files are the ones TRL and verl users know, and it
has ``purge_step``, TensorBoard's own mechanism for a restarted run (below).

What lands where (``[tracking.tensorboard] log_dir``, default ``<output_dir>/tensorboard``, one
TensorBoard run):
- scalars: every numeric metric of a step under its trainer key unchanged (``actor/pg_loss``,
  ``val/reward/mean``: the names metrics.jsonl and MLflow use), at the trainer step; TensorBoard groups
  the charts by the prefix before the first ``/``;
- text: ``config`` (config.json: the resolved config and plugin versions) at step 0 of a fresh run, and
  ``samples/<name>`` (``rollouts``, ``val``), the first ``max_sample_rows`` rows of each sample table as a
  markdown table at its step.

Resume policy: the trainer resumes from its newest checkpoint (step S, whose state holds this tracker's
``{"step": S}``) and replays the steps after it, some of which the killed process may already have
written. The resumed writer opens a new event file that starts with ``SessionLog.START`` at step S + 1
(``purge_step``): TensorBoard's readers drop every event at step S + 1 or later that came before it, so
each step is read once, with the resumed process's values. A fresh run whose log folder already holds
event files (``trainer.resume = "never"`` on an old run directory) purges from step 0, as the jsonl
tracker starts metrics.jsonl afresh. ``state_dict()`` (called at every checkpoint) flushes, so the steps a
checkpoint covers are on disk before the checkpoint exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter  # ImportError without tensorboard: the registry's install line

from nanoverl_core import Config, UserError
from nanoverl_core.config import settings_or_defaults

from .settings import TensorBoardSettings

_CELL_CHARS = 300
"""A sample table's cells are cut to this many characters (a long response would make the table unreadable)."""
UI_PORT = 6006


def make_tracker(config: Config, run_dir: Path, state: dict | None) -> TensorBoardTracker:
    """The hook's factory: ``state`` is a previous ``state_dict()`` when resuming, else None."""
    return TensorBoardTracker(config, Path(run_dir), state)


def tensorboard_settings(config: Config) -> TensorBoardSettings:
    """config's [tracking.tensorboard] table (the defaults for a Config built in code, without `load_config`)."""
    settings = config.tracking.settings.get("tensorboard")
    return settings_or_defaults(settings, TensorBoardSettings)


class TensorBoardTracker:
    def __init__(self, config: Config, run_dir: Path, state: dict | None):
        settings = tensorboard_settings(config)
        self.log_dir = Path(settings.log_dir) if settings.log_dir else run_dir / "tensorboard"
        self.flush_every_step = settings.flush_secs == 0
        self.max_sample_rows = settings.max_sample_rows
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"tracking.tensorboard.log_dir: cannot create {self.log_dir} ({exc.strerror or exc}); "
                            "set [tracking.tensorboard] log_dir to a writable folder, or remove \"tensorboard\" "
                            "from tracking.trackers") from None
        self.last_step = int((state or {}).get("step", 0))
        if state is not None:
            purge_step = self.last_step + 1      # the first step the trainer replays
        elif any(self.log_dir.glob("events.out.tfevents.*")):
            purge_step = 0                       # a fresh run over an old one: hide all of the old
        else:
            purge_step = None
        self.writer = SummaryWriter(str(self.log_dir), purge_step=purge_step,
                                    flush_secs=settings.flush_secs or 120)
        if state is None:
            self.writer.add_text("config", _code_block(_run_config(run_dir, config)), 0)
        verb = "continuing" if state is not None else "writing"
        print(f"tensorboard: {verb} {self.log_dir}; browse: {self.browse_hint()}", flush=True)

    # ---- the tracker protocol ---------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue  # not a number: metrics.jsonl has it
            self.writer.add_scalar(key, value, step)
        self.last_step = step
        if self.flush_every_step:
            self.writer.flush()

    def log_samples(self, name: str, rows: list[dict], step: int) -> None:
        """The first max_sample_rows rows as a markdown table, the text summary ``samples/<name>``."""
        rows = rows[:self.max_sample_rows]
        if rows:
            self.writer.add_text(f"samples/{name}", _markdown_table(rows), step)

    def state_dict(self) -> dict:
        self.writer.flush()  # the checkpoint being written covers these steps: they must be on disk first
        return {"step": self.last_step}

    def close(self, success: bool) -> None:
        self.writer.flush()
        self.writer.close()

    def browse_hint(self) -> str:
        return f"tensorboard --logdir {self.log_dir.resolve()} --host 127.0.0.1 --port {UI_PORT}"


# ---- helpers ------------------------------------------------------------------------------------------------
def _run_config(run_dir: Path, config: Config) -> dict:
    """run_dir/config.json as the trainer wrote it ({"config", "plugins"}), else built from ``config``."""
    try:
        data = json.loads((run_dir / "config.json").read_text())
        if isinstance(data, dict) and "config" in data:
            return data
    except (OSError, ValueError):
        pass
    return {"config": config.to_dict(), "plugins": {}}


def _code_block(data: Any) -> str:
    """JSON as a markdown code block (indented four spaces: TensorBoard's markdown renders it verbatim)."""
    return "\n".join("    " + line for line in json.dumps(data, indent=2, default=str).splitlines())


def _markdown_table(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > _CELL_CHARS:
        text = text[:_CELL_CHARS] + "..."
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n") or " "
