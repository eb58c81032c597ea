"""The ``mlflow`` tracker: every run browsable in the MLflow UI, a resumed run continues its MLflow run.

Selected by ``tracking.trackers = [..., "mlflow"]``; needs ``pip install "nanoverl[mlflow]"`` (this
distribution, nanoverl-mlflow, and mlflow). This module is the only place that imports mlflow, and it is
imported only when "mlflow" is selected.

What lands where (docs/mlflow.md has the user's view):
- one MLflow run per run directory, in experiment ``[tracking.mlflow] experiment``, named
  ``[tracking.mlflow] run_name`` or the run directory's name;
- params: the resolved config flattened to dotted keys (``actor.lr``); tags: plugin versions,
  ``nanoverl.run_dir``, ``nanoverl.checkpoint_dir``; artifacts: ``config.json`` and
  ``samples/<name>_step_<N>.json`` tables;
- metrics: one ``log_batch`` per trainer step, at ``step``; ``reward/mean`` and ``val/reward/mean`` are
  also logged as ``_headline/reward_mean`` and ``_headline/val_reward_mean``, the UI's first charts
  (HEADLINE_METRICS says why).

Resume policy: the trainer resumes from its newest checkpoint and replays the steps after it, some of
which the killed process may already have logged. MLflow's metric history is append-only, so on resume
the tracker reads the highest step already logged for every metric key and drops incoming values at
or below it. Each step then appears exactly once; a replayed step keeps its first-logged value (the
same value for everything but wall-clock metrics, since the trainer's resume is exact).

Failures: a store that cannot be reached at start is a ``UserError`` (exit 2). Once running, a
failed call never raises: the step waits in a queue, one warning goes to stderr, and the queue is
sent again with a later step (metrics.jsonl stays the complete record either way).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.utils.validation import (MAX_ENTITY_KEY_LENGTH, MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH,
                                     MAX_PARAMS_TAGS_PER_BATCH, MAX_TAG_VAL_LENGTH)

from nanoverl_core.config import Config, settings_or_defaults
from nanoverl_core.errors import UserError

from .settings import MlflowSettings

# MLflow's HTTP client retries a failed request for minutes by default, logging each retry. These
# bound the tracker's own calls (values the user exported win): no HTTP-level retry, since a failed
# step is queued and sent again with a later step anyway, and short timeouts.
START_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
RUN_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

# Names MLflow accepts for metrics and params (mlflow.utils.validation): anything else becomes "_".
_UNSAFE_NAME_CHARS = re.compile(r"[^/\w.\- :]")
UI_PORT = 5000


def make_tracker(config: Config, run_dir: Path, state: dict | None) -> MlflowTracker:
    """The hook's factory: ``state`` is a previous ``state_dict()`` when resuming, else None."""
    return MlflowTracker(config, Path(run_dir), state)


def mlflow_settings(config: Config) -> MlflowSettings:
    """config's [tracking.mlflow] table (the defaults for a Config built in code, without `load_config`)."""
    settings = config.tracking.settings.get("mlflow")
    return settings_or_defaults(settings, MlflowSettings)


EXPERIMENT_KIND = "mlflow.experimentKind"
"""The experiment tag MLflow 3's UI reads to pick the experiment's view (training or GenAI)."""

HEADLINE_METRICS = {"reward/mean": "_headline/reward_mean", "val/reward/mean": "_headline/val_reward_mean"}
"""Metrics also logged, in MLflow only, under a second key, so that they are the first charts in the UI.
MLflow's run page and the experiment's chart view put a key's charts in the section named by its prefix
(everything before the last '/'), order the sections by name and put unprefixed keys ("Model metrics")
last (MLflow 3.17). No tag changes that, and a layout the user arranges is kept in their browser only.
"_" sorts before the trainer's lowercase prefixes, so the "_headline" section comes first, holding the
training reward and the held-out reward. metrics.jsonl and the original MLflow keys stay as they are."""


class MlflowTracker:
    retry_after_s: float = 30.0
    """After a failed call, wait this long before trying again (a dead server costs one timeout per wait)."""
    max_pending_steps: int = 10_000
    """Steps kept for a later retry while the store is unreachable; older ones are dropped."""

    def __init__(self, config: Config, run_dir: Path, state: dict | None):
        settings = mlflow_settings(config)
        self.run_dir = run_dir.resolve()
        self.uri = resolve_tracking_uri(settings.uri, self.run_dir)
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
        except Exception as exc:  # a scheme no store of this mlflow serves
            raise UserError(f"mlflow tracking store {_redact(self.uri)} cannot be used ({_reason(exc)}); set "
                            "[tracking.mlflow] uri (or $MLFLOW_TRACKING_URI) to a store mlflow serves") from None
        self._pending: list[tuple[int, list[Metric]]] = []  # (step, metrics not yet accepted by the store)
        self._logged_before: dict[str, int] = {}             # key -> highest step logged before this resume
        self._retry_at = 0.0
        self._outage: str | None = None                      # reason of the ongoing failure, if any
        self._dropped = 0                                    # steps given up after max_pending_steps
        flat = flatten_config(config.to_dict())
        run_config = _read_run_config(self.run_dir, config)
        try:
            with _http_limits(START_HTTP_LIMITS):
                self.experiment_id = self._experiment(settings.experiment)
                resumed = self._start_run((state or {}).get("run_id"))
                run = resumed or self.client.create_run(
                    self.experiment_id, run_name=settings.run_name or self.run_dir.name,
                    tags={"mlflow.user": _user(), "mlflow.source.name": "nanoverl-train"})  # the UI's columns
                self.run_id, self.run_name = run.info.run_id, run.info.run_name
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"mlflow tracking store {_redact(self.uri)} cannot be used ({_reason(exc)}); start or "
                            "fix it, set [tracking.mlflow] uri (or $MLFLOW_TRACKING_URI) to a reachable store, or "
                            'remove "mlflow" from tracking.trackers') from None
        with _http_limits(RUN_HTTP_LIMITS):
            self._log_run_info(flat, run_config, resumed)
        verb = "continuing" if resumed else "logging"
        print(f"mlflow: {verb} run {self.run_name!r} ({self.run_id}) in experiment {settings.experiment!r}; "
              f"browse: {self.browse_hint()}", flush=True)

    # ---- start ----------------------------------------------------------------------------------------
    def _experiment(self, name: str) -> str:
        """The experiment's id, created if needed and marked as model training: MLflow 3 opens an unmarked
        experiment in its GenAI view, where training runs hide under "Evaluation runs"."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(name, artifact_location=_sqlite_artifact_root(self.uri),
                                                     tags={EXPERIMENT_KIND: "custom_model_development"})
            except Exception:  # another run created it in between
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise UserError(f"mlflow experiment {name!r} in {_redact(self.uri)} is deleted; restore it "
                            f"(MLFLOW_TRACKING_URI={shlex.quote(_redact(self.uri))} mlflow experiments restore "
                            f"--experiment-id {experiment.experiment_id}) or set [tracking.mlflow] experiment to "
                            "another name")
        if EXPERIMENT_KIND not in experiment.tags:                  # never overrides a kind a user chose
            self.client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, "custom_model_development")
        return experiment.experiment_id

    def _start_run(self, run_id: str | None) -> Any:
        """The checkpoint's run if the store still has it (set RUNNING again), else None."""
        if run_id:
            try:
                run = self.client.get_run(run_id)
            except Exception as exc:
                if getattr(exc, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run = None
            if run is not None and run.info.lifecycle_stage == "active":
                self.client.update_run(run_id, status="RUNNING")
                self._logged_before = self._last_logged_steps(run)
                return run
            _warn(f"run {run_id} from the checkpoint is not an active run in {_redact(self.uri)}; "
                  "starting a new MLflow run")
        return None

    def _last_logged_steps(self, run: Any) -> dict[str, int]:
        """Highest logged step per metric key. A run's "latest" metrics are the ones at the highest step;
        the entities keep them as ``_metric_objs`` (read the histories if a store ever differs)."""
        latest = getattr(run.data, "_metric_objs", None)
        if latest is not None:
            return {m.key: m.step for m in latest}
        return {key: max(m.step for m in self.client.get_metric_history(run.info.run_id, key))
                for key in run.data.metrics}

    def _log_run_info(self, flat: dict[str, str], run_config: dict, resumed: Any) -> None:
        """Tags, params and config.json. MLflow params cannot change, so a resume adds only new keys
        and keeps a changed config as config_resume_<n>.json."""
        tags = {"nanoverl.run_dir": str(self.run_dir), "nanoverl.checkpoint_dir": str(self.run_dir / "checkpoints")}
        tags.update({f"nanoverl.plugin.{dist}": str(version) for dist, version in run_config["plugins"].items()})
        artifact = "config.json"
        if resumed is not None:
            resumes = int(resumed.data.tags.get("nanoverl.resumes", "0")) + 1
            tags["nanoverl.resumes"] = str(resumes)
            existing = resumed.data.params
            changed = sorted(k for k, v in flat.items() if k in existing and existing[k] != v)
            flat = {k: v for k, v in flat.items() if k not in existing}
            artifact = f"config_resume_{resumes}.json" if changed else None
            if changed:
                more = ", ..." if len(changed) > 5 else ""
                _warn(f"the config changed on resume ({', '.join(changed[:5])}{more}); MLflow params cannot "
                      f"change, so the run keeps the old values and {artifact} holds the new config")
        entities = [RunTag(_safe_name(k), v[:MAX_TAG_VAL_LENGTH]) for k, v in tags.items()]
        entities += [Param(k, v) for k, v in flat.items()]
        try:
            for i in range(0, len(entities), MAX_PARAMS_TAGS_PER_BATCH):
                chunk = entities[i:i + MAX_PARAMS_TAGS_PER_BATCH]
                self.client.log_batch(self.run_id, params=[e for e in chunk if isinstance(e, Param)],
                                      tags=[e for e in chunk if isinstance(e, RunTag)])
            if artifact:
                self.client.log_text(self.run_id, json.dumps(run_config, indent=2), artifact)
        except Exception as exc:
            _warn(f"could not log the params, tags or config.json ({_reason(exc)}); metrics will still be logged")

    # ---- the tracker protocol ---------------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            key = _safe_name(key)
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue  # not a number: metrics.jsonl has it
            for name in (key, HEADLINE_METRICS.get(key)):
                if name and step > self._logged_before.get(name, -1):
                    batch.append(Metric(name, value, now, step))
        if batch:
            self._pending.append((step, batch))
        if len(self._pending) > self.max_pending_steps:  # a long outage: the oldest steps live in metrics.jsonl only
            self._pending.pop(0)
            self._dropped += 1
        if time.monotonic() >= self._retry_at:
            self._flush()

    def log_samples(self, name: str, rows: list[dict], step: int) -> None:
        """A table as ``samples/<name>_step_<N>.json``: {"columns": [...], "data": [[...], ...]}, which
        ``pandas.read_json(path, orient="split")`` reads. A replayed step rewrites the same file."""
        columns = list(dict.fromkeys(key for row in rows for key in row))
        table = {"columns": columns, "data": [[row.get(c) for c in columns] for row in rows]}
        path = f"samples/{_safe_name(name).replace('/', '_')}_step_{step}.json"
        try:
            with _http_limits(RUN_HTTP_LIMITS):
                self.client.log_text(self.run_id, json.dumps(table, default=str), path)
        except Exception as exc:
            _warn(f"could not log {path} ({_reason(exc)}); not retried")

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def close(self, success: bool) -> None:
        status = "FINISHED" if success else "FAILED"
        self._flush()
        if self._pending:
            first, last = self._pending[0][0], self._pending[-1][0]
            earlier = f" and {self._dropped} earlier step(s)" if self._dropped else ""
            _warn(f"steps {first}..{last}{earlier} were not logged ({self._outage}); metrics.jsonl stays complete")
        try:
            with _http_limits(RUN_HTTP_LIMITS):
                self.client.set_terminated(self.run_id, status=status)
        except Exception as exc:
            _warn(f"could not mark run {self.run_id} {status} ({_reason(exc)})")
        print(f"mlflow: run {self.run_name!r} ({self.run_id}) ended {status}; browse: {self.browse_hint()}",
              flush=True)

    # ---- helpers ------------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Send queued steps in order; stop at the first failure and try again after retry_after_s."""
        sent = 0
        try:
            with _http_limits(RUN_HTTP_LIMITS):
                while self._pending:
                    step, batch = self._pending[0]
                    while batch:  # drop each chunk once the store has it, so a retry never logs it twice
                        self.client.log_batch(self.run_id, metrics=batch[:MAX_METRICS_PER_BATCH])
                        del batch[:MAX_METRICS_PER_BATCH]
                    self._pending.pop(0)
                    sent += 1
        except Exception as exc:
            self._retry_at = time.monotonic() + self.retry_after_s
            if self._outage is None:
                _warn(f"could not log step {self._pending[0][0]} ({_reason(exc)}); will retry with later steps, "
                      "metrics.jsonl stays complete")
            self._outage = _reason(exc)
            return
        if self._outage is not None:
            _warn(f"logging works again; sent {sent} delayed step(s)", prefix="note")
            self._outage = None

    def browse_hint(self) -> str:
        """How to look at this run: a URL for a server, the `mlflow ui` command for a local store. The URL
        opens the run's charts in the UI's model-training view (MLflow 3 starts in its GenAI view)."""
        scheme = urlsplit(self.uri).scheme
        path = f"#/experiments/{self.experiment_id}/runs/{self.run_id}/model-metrics?workflowType=machine_learning"
        if scheme in ("http", "https"):
            return f"{_redact(self.uri).rstrip('/')}/{path}"
        if scheme.startswith("databricks"):
            return f"open experiment {self.experiment_id} in your Databricks workspace"
        uri = self.uri
        if _sqlite_file(uri):  # an absolute path: the command works from any folder
            uri = f"sqlite:///{_sqlite_file(uri).resolve()}"
        return (f"mlflow ui --backend-store-uri {shlex.quote(_redact(uri))} --host 127.0.0.1 --port {UI_PORT}"
                f", then open http://127.0.0.1:{UI_PORT}/{path}")


# ---- free functions ---------------------------------------------------------------------------------------
def default_tracking_uri(run_dir: Path) -> str:
    """The embedded store: one sqlite file next to the run directories, shared by all of them."""
    return f"sqlite:///{run_dir.resolve().parent / 'mlflow.db'}"


def resolve_tracking_uri(configured: str, run_dir: Path) -> str:
    """[tracking.mlflow] uri, else $MLFLOW_TRACKING_URI, else the embedded store. A sqlite file's folder is
    created; failing that is a UserError."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI", "") or default_tracking_uri(run_dir)
    if _sqlite_file(uri):
        folder = _sqlite_file(uri).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"mlflow tracking store {uri} cannot be created ({exc.strerror or exc}: {folder}); "
                            "set [tracking.mlflow] uri to a writable location, or remove \"mlflow\" from "
                            "tracking.trackers") from None
    return uri


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI (relative to the working folder with three slashes)."""
    if not uri.startswith("sqlite:///") or ":memory:" in uri:
        return None
    return Path(uri.removeprefix("sqlite:///").split("?")[0])


def _sqlite_artifact_root(uri: str) -> str | None:
    """A sqlite store keeps artifacts in mlartifacts/ beside its file (MLflow's default would be ./mlruns in
    whatever folder the trainer runs from). Other stores choose their own artifact location."""
    db = _sqlite_file(uri)
    return (db.resolve().parent / "mlartifacts").as_uri() if db else None


def flatten_config(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"actor": {"lr": 1e-6}} -> {"actor.lr": "1e-06"}. Values are written as in a config override
    (JSON for non-strings), cut to MLflow's param length limit."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, name + "."))
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > MAX_PARAM_VAL_LENGTH:
            text = text[:MAX_PARAM_VAL_LENGTH - 15] + "...(truncated)"
        flat[_safe_name(name)] = text
    return flat


def _read_run_config(run_dir: Path, config: Config) -> dict:
    """run_dir/config.json as the trainer wrote it ({"config", "plugins"}), else built from ``config``."""
    try:
        data = json.loads((run_dir / "config.json").read_text())
        if isinstance(data, dict) and isinstance(data.get("plugins"), dict):
            return data
    except (OSError, ValueError):
        pass
    return {"config": config.to_dict(), "plugins": {}}


def _safe_name(name: str) -> str:
    """A metric / param / tag name MLflow accepts: '/' is fine, other characters outside
    [\\w.\\- :/] become '_', and empty, '.' or '..' path segments are dropped."""
    parts = [p for p in _UNSAFE_NAME_CHARS.sub("_", name).split("/") if p not in ("", ".", "..")]
    return "/".join(parts)[:MAX_ENTITY_KEY_LENGTH] or "_"


@contextlib.contextmanager
def _http_limits(limits: dict[str, str]):
    """Set MLflow's HTTP retry/timeout variables for the calls inside, unless the user set them.
    MLflow reads them on every request; the trainer calls trackers from one thread."""
    added = [key for key in limits if key not in os.environ]
    os.environ.update({key: limits[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _reason(exc: BaseException) -> str:
    """One short line: the OS error if there is one ("Connection refused"), else the message's start."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    return text if len(text) <= 200 else text[:200] + "..."


def _redact(uri: str) -> str:
    """The URI with any password replaced, so it can be printed."""
    parts = urlsplit(uri)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return "unknown"


def _warn(message: str, prefix: str = "warning") -> None:
    print(f"{prefix}: mlflow: {message}", file=sys.stderr, flush=True)
