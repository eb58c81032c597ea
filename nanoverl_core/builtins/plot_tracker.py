"""The ``plot`` tracker: ``metrics.png`` in the run directory, the run's learning curves.

Four panels against the trainer step: train reward (``reward/mean``), validation
(``val/reward/mean``; with several data sources also one line per ``val/<source>/reward/mean``),
entropy (``actor/entropy``) and response length (``rollout/response_length/mean``, the max dashed).
A panel whose metric was never logged says so instead of drawing.

When it redraws: after a step that comes ``[tracking.plot] every_s`` seconds (30 by default; 0:
every step) or more after the last draw (or the tracker's start), after a step that logged
validation metrics (unless the last draw was less than ten draw-times ago, so a fast run that
validates every step is not slowed down by its plot), and always on ``close``. A short run draws
once or twice; a long one spends a fraction of a second per ``every_s`` on its plot.

Each draw renders the whole history into a new PNG, written to ``metrics.png.tmp`` and moved over
``metrics.png`` with ``os.replace``: a reader never sees a half-written file, and a kill leaves the
previous complete one.

Resume: the history before the resumed step comes from ``metrics.jsonl`` (the jsonl tracker's file),
read at start for the steps up to the checkpoint's step; the steps the trainer replays replace the
rows it logged before the kill. Without the jsonl tracker, a resumed run's plot starts at the
resumed step.

Failures: NaN, infinite and non-numeric values are skipped; a draw that fails (matplotlib missing,
a full disk) is one warning on stderr and the run goes on. matplotlib is imported at the first draw
only, so importing this module (listing plugins, checking a config) stays cheap.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from ..config import at_least, settings_or_defaults

FILE_NAME = "metrics.png"
_VAL_SOURCE = re.compile(r"^val/(.+)/reward/mean$")  # val/<data_source>/reward/mean
_PLOTTED = {"reward/mean", "val/reward/mean", "actor/entropy", "rollout/response_length/mean",
            "rollout/response_length/max"}


@attrs.define
class PlotSettings:
    every_s: float = attrs.field(default=30.0, validator=at_least(0))
    """Redraw metrics.png after a step that ends this many seconds after the last draw (0: every
    step); validation steps and the end of the run redraw too."""


def make_tracker(config: Any, run_dir: Path, state: dict | None) -> PlotTracker:
    """The hook's factory: ``state`` is a previous ``state_dict()`` when resuming, else None."""
    settings = None
    try:
        settings = config.tracking.settings.get("plot")
    except AttributeError:
        pass
    return PlotTracker(config, Path(run_dir), state, settings)


def _plotted(key: str) -> bool:
    return key in _PLOTTED or _VAL_SOURCE.match(key) is not None


def _finite(value: Any) -> float | None:
    """The value as a float, or None for NaN, infinities, booleans and anything that is not a number."""
    if isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


class PlotTracker:
    def __init__(self, config: Any, run_dir: Path, state: dict | None, settings: PlotSettings | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / FILE_NAME
        self.tmp_path = self.run_dir / (FILE_NAME + ".tmp")
        self.every_s = settings_or_defaults(settings, PlotSettings).every_s
        self.trainer = getattr(config, "trainer", None)  # total_steps read at each draw (total_epochs sets it late)
        self.rows: dict[int, dict[str, float]] = {}  # step -> plotted metrics of that step
        self.last_step = 0
        self.draws = 0                   # completed draws (tests and curious users)
        self._last_draw = time.monotonic()  # of the last draw attempt (the start counts as one)
        self._draw_s = 0.0               # how long the last draw took
        self._warned = False
        self._disabled = False           # matplotlib is missing: stop trying
        self._fig: Any = None            # made at the first draw, reused by every later one (see _figure)
        try:
            self.tmp_path.unlink(missing_ok=True)  # left by a kill mid-write
        except OSError:
            pass  # the first draw reports an unusable run directory
        self._read_history(state)

    # ---- resume -------------------------------------------------------------------------------------------
    def _read_history(self, state: dict | None) -> None:
        """Rows of metrics.jsonl up to the resumed step: the checkpoint's step from our state; a
        resume without our state (the tracker was added on resume) takes every row, and the
        replayed steps replace theirs; a fresh run (state None) keeps what the jsonl tracker keeps."""
        if state is None:
            last: float = 0
        else:
            step = state.get("step")
            last = step if isinstance(step, int) and not isinstance(step, bool) else math.inf
        try:
            lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        except (OSError, UnicodeDecodeError):  # none yet (or unreadable: the plot starts here)
            lines = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short by a kill
                continue
            if not isinstance(row, dict):
                continue
            step = row.pop("step", None)
            if isinstance(step, int) and not isinstance(step, bool) and step <= last:
                self._add(row, step)
        self.last_step = int(last) if last != math.inf else max(self.rows, default=0)

    def _add(self, metrics: dict, step: int) -> dict[str, float]:
        """Keep the plotted, finite values; a step logged again replaces its earlier row."""
        row = {}
        for key, value in metrics.items():
            if isinstance(key, str) and _plotted(key):
                value = _finite(value)
                if value is not None:
                    row[key] = value
        self.rows[step] = row
        return row

    # ---- the tracker protocol -------------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = self._add(metrics, int(step))
        self.last_step = int(step)
        now = time.monotonic()
        if now - self._last_draw >= self.every_s:
            self._draw()
        elif any(key.startswith("val/") for key in row) and now - self._last_draw >= 10 * self._draw_s:
            self._draw()

    def log_samples(self, name: str, rows: list[dict], step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"step": self.last_step}

    def close(self, success: bool) -> None:
        if self.rows:
            self._draw("finished" if success else "stopped")

    # ---- data -------------------------------------------------------------------------------------------------
    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in step order."""
        points = sorted((step, row[key]) for step, row in self.rows.items() if key in row)
        return [s for s, _ in points], [v for _, v in points]

    def val_sources(self) -> list[str]:
        keys = {key for row in self.rows.values() for key in row}
        return sorted(m.group(1) for m in map(_VAL_SOURCE.match, keys) if m)

    # ---- drawing ------------------------------------------------------------------------------------------------
    def _draw(self, ended: str = "") -> None:
        """Render and atomically replace metrics.png; a failure is a warning, never an exception."""
        if self._disabled:
            return
        self._last_draw = time.monotonic()
        try:
            import matplotlib.backends.backend_agg  # noqa: F401  (once per process; not a draw's cost)
        except ImportError as exc:
            self._disabled = True
            self._warn(f"cannot draw {FILE_NAME}: {exc}; pip install matplotlib, or remove \"plot\" from "
                       "tracking.trackers")
            return
        start = time.monotonic()
        try:
            self._render(ended)
            self.draws += 1
        except Exception as exc:
            self.tmp_path.unlink(missing_ok=True)
            self._warn(f"could not write {self.path} ({type(exc).__name__}: {exc}); training goes on")
        finally:
            self._draw_s = time.monotonic() - start

    def _warn(self, message: str) -> None:
        if not self._warned:  # once: a broken disk must not flood the log
            self._warned = True
            print(f"warning: plot: {message}", file=sys.stderr, flush=True)

    def _render(self, ended: str) -> None:
        fig = self._figure()
        fig.clear()
        # fixed margins: a constrained layout would double the cost of a draw
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.91, wspace=0.2, hspace=0.32)
        (reward, val), (entropy, length) = fig.subplots(2, 2)
        self._panel(reward, "train reward", "reward", [("reward/mean", "reward/mean", {})])
        sources = self.val_sources()  # one source is the overall line again: drawn once
        sources = [(f"val/{src}/reward/mean", f"val/{src}", {"linewidth": 1.0, "alpha": 0.8})
                   for src in (sources if len(sources) > 1 else [])]
        self._panel(val, "validation reward", "reward",
                    [("val/reward/mean", "val/reward/mean", {"linewidth": 2.0, "color": "black"}), *sources])
        self._panel(entropy, "entropy", "entropy (nats/token)", [("actor/entropy", "actor/entropy", {})])
        self._panel(length, "response length", "tokens",
                    [("rollout/response_length/mean", "mean", {}),
                     ("rollout/response_length/max", "max", {"linestyle": "--"})])
        total = getattr(self.trainer, "total_steps", None)
        of = f" of {total}" if isinstance(total, int) and total > 0 else ""
        state = f"{ended} at step {self.last_step}" if ended else f"step {self.last_step}{of}"
        fig.suptitle(f"{self.run_dir.name or self.run_dir.resolve().name}: {state}", fontsize=13)

        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.tmp_path, "wb") as f:
            fig.savefig(f, format="png")
            f.flush()
            os.fsync(f.fileno())
        os.replace(self.tmp_path, self.path)

    def _figure(self) -> Any:
        """The tracker's one figure, made at the first draw and cleared and redrawn at each one after.
        A new figure per draw would leave the old one to Python's cyclic collector (a figure is a
        web of cycles), and with it its canvas's ~4 MiB pixel buffer, which the collector does not
        count: in a trainer with a million long-lived objects a full collection came every few dozen
        draws, so resident memory grew ~5 MiB a draw in between (benchmarks/memory_long.py)."""
        if self._fig is None:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            self._fig = Figure(figsize=(12, 8), dpi=100)
            FigureCanvasAgg(self._fig)
        return self._fig

    def _panel(self, ax: Any, title: str, ylabel: str, lines: list[tuple[str, str, dict]]) -> None:
        from matplotlib.ticker import MaxNLocator

        ax.set_title(title, fontsize=12)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        drawn = 0
        if len(self.rows) > 1:  # every panel spans the run's steps, so their x axes line up
            first, last = min(self.rows), max(self.rows)
            pad = max(0.5, 0.02 * (last - first))
            ax.set_xlim(first - pad, last + pad)
        for key, label, style in lines:
            steps, values = self.series(key)
            if not steps:
                continue
            marker = "o" if len(steps) <= 40 else None  # a few points (validation, a short run) stay visible
            ax.plot(steps, values, label=label, marker=marker, markersize=3, **style)
            drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, f"{lines[0][0]} not logged", transform=ax.transAxes, ha="center", va="center",
                    color="gray", fontsize=11)
            ax.set_xticks([])
            ax.set_yticks([])
            return
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if drawn > 1 or len(lines) > 1:
            ax.legend(fontsize=9, loc="best")
