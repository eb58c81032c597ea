"""The ``wandb`` tracker: the run in Weights & Biases, offline by default; a resumed run continues its W&B run.

Selected by ``tracking.trackers = [..., "wandb"]``; needs ``pip install "nanoverl[wandb]"``. Only this
module imports wandb, and only when "wandb" is selected.

What lands where (``<output_dir>/wandb/``, W&B's own layout: one ``offline-run-<time>-<id>/`` folder, or
``run-<time>-<id>/`` online, per process, each with its ``run-<id>.wandb`` transaction log):
- one W&B run per run directory, in ``[tracking.wandb] project`` (default "nanoverl"), named after the run
  directory; its config is the resolved config (``actor.lr`` and so on in the UI) plus
  ``nanoverl.plugins`` (the plugin versions) and ``nanoverl.run_dir``;
- metrics: every numeric metric of a step under its trainer key unchanged (``actor/pg_loss``,
  ``val/reward/mean``: the names metrics.jsonl and MLflow use) at ``step`` = the trainer step, one
  history row per step;
- ``samples/<name>`` (``rollouts``, ``val``): the first ``max_sample_rows`` rows of each sample table as a
  ``wandb.Table`` in the same row as its step's metrics.

Mode: ``[tracking.wandb] mode``, else ``$WANDB_MODE``, else "offline": training must not need a login or
the network (the machines this runs on often have neither); ``wandb sync <output_dir>/wandb/offline-run-*``
uploads the folders later, in order.

Resume policy: the W&B run id is kept in the tracker's state (the checkpoint), so a resumed nanoverl run
calls ``wandb.init(id=<that id>, resume="allow")`` and continues the same W&B run. The trainer replays the
steps after its checkpoint, some of which the killed process may already have logged; W&B's history is
append-only and a step can be logged once, so at start the tracker reads the highest step already in
this run's ``.wandb`` files in the run directory (and, online, the server's ``starting_step``) and drops
incoming steps at or below it. Across the folders of the killed and the resumed process each step is then
logged once; a replayed step keeps its first-logged value (the same value for everything but wall-clock
metrics, since the trainer's resume is exact).

Lifetime: wandb runs a service process (``wandb-core``) beside the trainer. ``close`` finishes the run with
exit code 0, or 1 when the run failed (W&B marks it "failed"), and tears the service down; a trainer killed
outright leaves a run W&B marks "crashed", and the service exits with it.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import wandb  # ImportError without wandb: the registry prints the install line
from wandb.proto import wandb_internal_pb2

from nanoverl_core import Config, UserError
from nanoverl_core.config import settings_or_defaults

from .settings import WandbSettings


def make_tracker(config: Config, run_dir: Path, state: dict | None) -> WandbTracker:
    """The hook's factory: ``state`` is a previous ``state_dict()`` when resuming, else None."""
    return WandbTracker(config, Path(run_dir), state)


def wandb_settings(config: Config) -> WandbSettings:
    """config's [tracking.wandb] table (the defaults for a Config built in code, without `load_config`)."""
    settings = config.tracking.settings.get("wandb")
    return settings_or_defaults(settings, WandbSettings)


class WandbTracker:
    write_timeout_s: float = 30.0
    """At a checkpoint, how long to wait for wandb-core to write the steps the checkpoint covers."""

    def __init__(self, config: Config, run_dir: Path, state: dict | None):
        settings = wandb_settings(config)
        self.run_dir = run_dir.resolve()
        self.max_sample_rows = settings.max_sample_rows
        self._last_step = -1
        self._written, self._read_to = -1, 0  # this process's .wandb file: highest step in it, offset read to
        self._tables: dict[int, dict[str, Any]] = {}  # step -> {"samples/<name>": wandb.Table} not yet logged
        self.mode = settings.mode or os.environ.get("WANDB_MODE", "") or "offline"
        run_id = (state or {}).get("run_id") or secrets.token_hex(4)  # W&B's own ids are 8 [a-z0-9]
        self._logged_before = last_logged_step(self.run_dir / "wandb", run_id)  # before init adds a folder
        run_config = _read_run_config(self.run_dir, config)
        try:
            self.run = wandb.init(
                project=settings.project or os.environ.get("WANDB_PROJECT") or "nanoverl",
                entity=settings.entity or None, name=settings.name or self.run_dir.name,
                group=settings.group or None, tags=settings.tags or None, mode=self.mode,
                dir=str(self.run_dir), id=run_id, resume="allow", settings=_wandb_settings(),
                config={**run_config["config"],
                        "nanoverl": {"plugins": run_config["plugins"], "run_dir": str(self.run_dir)}})
        except Exception as exc:
            raise UserError(f"wandb could not start run {run_id} in mode {self.mode!r} ({_reason(exc)}); for "
                            "online logging run `wandb login` first, or set [tracking.wandb] mode = \"offline\", "
                            "or remove \"wandb\" from tracking.trackers") from None
        self.run_id = run_id
        try:
            starting_step = int(self.run.starting_step)  # online: the step after what the server holds
        except (AttributeError, TypeError, ValueError):    # a disabled run has none
            starting_step = 0
        self._logged_before = max(self._logged_before, starting_step - 1)
        verb = "continuing" if state is not None and state.get("run_id") else "logging"
        after = f" after step {self._logged_before}" if self._logged_before >= 0 else ""
        print(f"wandb: nanoverl {verb} run {self.run.name!r} ({run_id}){after}, mode {self.mode}, "
              f"in {self.run_dir / 'wandb'}", flush=True)

    # ---- the tracker protocol ---------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """One history row per step, with the step's sample tables (the trainer logs a step's metrics last)."""
        if step <= self._logged_before:
            return
        row: dict[str, Any] = {}
        for key, value in metrics.items():
            try:
                row[key] = float(value)
            except (TypeError, ValueError):
                continue  # not a number: metrics.jsonl has it
        for earlier in sorted(s for s in self._tables if s < step):  # tables of a step that logged no metrics
            self.run.log(self._tables.pop(earlier), step=earlier)
        self.run.log({**row, **self._tables.pop(step, {})}, step=step, commit=True)  # sent now, not at step + 1
        self._last_step = step

    def log_samples(self, name: str, rows: list[dict], step: int) -> None:
        """Kept until the step's metrics, which the trainer logs last: one ``run.log`` call per step, one
        history row (the table's fields appear in it as ``samples/<name>._type`` and so on)."""
        rows = rows[:self.max_sample_rows]
        if not rows or step <= self._logged_before:
            return
        columns = list(dict.fromkeys(key for row in rows for key in row))
        data = [[_cell(row.get(c)) for c in columns] for row in rows]
        self._tables.setdefault(step, {})[f"samples/{name}"] = wandb.Table(columns=columns, data=data)

    def state_dict(self) -> dict:
        """Called at a checkpoint: first wait until wandb-core has written the steps it covers, since the
        resumed run will not replay them (wandb-core writes asynchronously; a kill loses what it has not)."""
        if self._last_step > self._logged_before and self.mode != "disabled":
            self._wait_written(self._last_step)
        return {"run_id": self.run_id}

    def close(self, success: bool) -> None:
        try:
            for step in sorted(self._tables):
                self.run.log(self._tables.pop(step), step=step)
            self.run.finish(exit_code=0 if success else 1)
        finally:
            wandb.teardown()  # ends the wandb-core service process this run started

    def _wait_written(self, step: int) -> None:
        """Poll this process's .wandb file, reading on from where the last poll stopped."""
        path = Path(self.run.settings.sync_file)
        deadline = time.monotonic() + self.write_timeout_s
        while True:
            self._written, self._read_to = last_step_in(path, self._read_to, self._written)
            if self._written >= step:
                return
            if time.monotonic() > deadline:
                print(f"warning: wandb: step {step} is not in {path} after {self.write_timeout_s:.0f} s; if the "
                      "run is killed now, W&B may miss steps up to this checkpoint (metrics.jsonl has them)",
                      file=sys.stderr, flush=True)
                return
            time.sleep(0.05)


# ---- reading back what a run already logged ----------------------------------------------------------------
_BLOCK = 32 * 1024
_FILE_HEADER = struct.Struct("<4sHB")   # b":W&B", magic 0xBEE1, version 0
_RECORD_HEADER = struct.Struct("<IHB")  # crc32 of (type + data), data length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def last_logged_step(wandb_dir: Path, run_id: str) -> int:
    """The highest history step in this run's ``.wandb`` files under ``wandb_dir`` (-1: none). A file cut
    short by a kill is read up to its last complete record."""
    paths = wandb_dir.glob(f"*run-*-{run_id}/run-{run_id}.wandb")
    return max((last_step_in(path)[0] for path in paths), default=-1)


def last_step_in(path: Path, start: int = 0, last: int = -1) -> tuple[int, int]:
    """(the highest history step in one ``.wandb`` file, or ``last`` if higher; the offset after its last
    complete record). Pass that offset back as ``start`` to read only what was written since."""
    for data, start in read_records(path, start):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(data)
        except Exception:
            break
        if record.WhichOneof("record_type") == "history":
            last = max(last, record.history.step.num)
    return last, start


def read_records(path: Path, start: int = 0) -> Iterator[tuple[bytes, int]]:
    """(record, the file offset after it) for each record of a W&B transaction log from ``start`` (0, or an
    offset this function yielded): the LevelDB log format (32 KiB blocks of checksummed chunks) after a
    7-byte W&B header, as ``wandb.sdk.internal.datastore`` read it before wandb-core took over. Stops at
    the first incomplete or corrupt chunk (a file still being written, or cut short by a kill)."""
    try:
        with path.open("rb") as file:
            header = file.read(_FILE_HEADER.size)
            start = max(start, _FILE_HEADER.size)
            file.seek(start)
            data = file.read()
    except OSError:
        return
    if len(header) < _FILE_HEADER.size or _FILE_HEADER.unpack(header)[0] != b":W&B":
        return
    pos, pending = start, b""                      # pos: the absolute offset; data begins at `start`
    while True:
        if _BLOCK - pos % _BLOCK < _RECORD_HEADER.size:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
        if pos + _RECORD_HEADER.size > start + len(data):
            return
        crc, length, kind = _RECORD_HEADER.unpack_from(data, pos - start)
        begin = pos - start + _RECORD_HEADER.size
        chunk = data[begin:begin + length]
        if len(chunk) < length or kind not in (_FULL, _FIRST, _MIDDLE, _LAST) \
                or zlib.crc32(bytes([kind]) + chunk) != crc:
            return
        pos += _RECORD_HEADER.size + length
        if kind == _FULL:
            yield chunk, pos
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        else:
            yield pending + chunk, pos


# ---- helpers ------------------------------------------------------------------------------------------------
LOG_FLUSH_S = 1.0
"""How often wandb-core writes the run's .wandb file (its default, 15 s, would make every checkpoint wait up to
15 s for its steps, and a kill lose up to 15 s of steps that the resumed run then logs again)."""


def _wandb_settings() -> wandb.Settings:
    """wandb.Settings with LOG_FLUSH_S where this wandb version has the (private) setting, else the defaults."""
    try:
        known = "x_transaction_log_flush_interval" in wandb.Settings.model_fields
    except AttributeError:  # not a pydantic model
        known = False
    return wandb.Settings(x_transaction_log_flush_interval=LOG_FLUSH_S) if known else wandb.Settings()


def _read_run_config(run_dir: Path, config: Config) -> dict:
    """run_dir/config.json as the trainer wrote it ({"config", "plugins"}), else built from ``config``."""
    try:
        data = json.loads((run_dir / "config.json").read_text())
        if isinstance(data, dict) and isinstance(data.get("config"), dict) and isinstance(data.get("plugins"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"config": config.to_dict(), "plugins": {}}


def _cell(value: Any) -> Any:
    """A table cell: numbers and strings as they are, anything else (an episode's turns) as JSON text."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, default=str)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
