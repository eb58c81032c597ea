"""`judge`: a language model grades the responses, through any OpenAI-compatible chat-completions URL.

A *batched* reward (`judge.batched = True`): the runtime calls it once per step with every row, in the one
worker process of batched rewards, so the step's requests go out together (`concurrency` at a time) and the
cache, the log and a served model stay open for the run. Per step:

1. plan the requests: pointwise, one per distinct rubric (rows with the same prompt and response share one);
   group, one per group of rows sharing a uid, every answer in it (RULER's relative scores);
2. answer each from the cache (sha256 of the exact request) or post it (client.py); cache each HTTP 200;
3. read each reply's score(s) (prompts.py); a reply without one is judge_unparsable;
4. log every request with its reply, the rows it scored and how it went (store.py);
5. a row whose request failed is scored by `fallback` when one is named, else returned as a
   `CallError(kind)`, counted in reward/errors/<kind> and handled by reward.on_error (raise, zero, drop).

Each judged row returns {"score": s, "judge_cached": 1 or 0}; with a fallback, {"score", "fallback/<kind>"}.
"""

from __future__ import annotations

import atexit
import time
from pathlib import Path
from typing import Any

import attrs

from nanoverl_core.reward import CallError, RewardContext

from .prompts import (Unparsable, build_request, parse_group, parse_pointwise, render_group, render_pointwise,
                      reply_text, request_key)
from .settings import JudgeSettings, check_config, template_text

ERROR_KINDS = ("judge_timeout", "judge_unreachable", "judge_http", "judge_unparsable")
"""How a judged row can fail (client.py has the first three), each counted as reward/errors/<kind>."""


@attrs.define
class Job:
    """One request and the rows (positions in the call's lists) it scores, in answer order."""

    rows: list[int]
    request: dict[str, Any]
    key: str
    cached: bool = False
    body: str = ""
    kind: str = "ok"
    message: str = ""
    scores: list[float] = attrs.Factory(list)
    attempts: int = 0
    seconds: float = 0.0


_OPEN: dict[str, Any] = {}
"""What this process keeps for the run: caches by path, served models by folder, fallbacks by name."""


def plan_jobs(prompts: list[str], responses: list[str], samples: list[dict], uids: list[str],
              settings: JudgeSettings) -> list[Job]:
    """The step's requests, one per distinct request (step 1)."""
    template, jobs = template_text(settings), {}
    if settings.mode == "group":
        groups: dict[str, list[int]] = {}
        for i, uid in enumerate(uids):
            groups.setdefault(uid, []).append(i)
        rubrics = [(rows, render_group(template, samples[rows[0]], prompts[rows[0]], [responses[i] for i in rows],
                                       settings)) for rows in groups.values()]
    else:
        rubrics = [([i], render_pointwise(template, samples[i], prompts[i], responses[i], settings))
                   for i in range(len(responses))]
    for rows, rubric in rubrics:
        request = build_request(rubric, settings)
        key = request_key(request)
        if key in jobs and settings.mode == "pointwise":
            jobs[key].rows += rows
        else:
            jobs[key if key not in jobs else f"{key}/{rows[0]}"] = Job(rows, request, key)
    return list(jobs.values())


def _cache(settings: JudgeSettings, run_dir: str):
    from .store import Cache

    path = settings.cache_path or (str(Path(run_dir) / "judge" / "cache.sqlite") if run_dir else "")
    if not settings.cache or not path:
        return Cache(None)
    if path not in _OPEN:
        _OPEN[path] = Cache(Path(path))
    return _OPEN[path]


def base_url(settings: JudgeSettings) -> str:
    """The judge's URL: base_url, or the local server of `serve`, started on first use and kept."""
    if not settings.serve:
        return settings.base_url
    if ("serve", settings.serve) not in _OPEN:
        from .server import start
        proc, url = start(settings.serve, settings.serve_batch_size)
        atexit.register(proc.kill)
        _OPEN[("serve", settings.serve)] = url
    return _OPEN[("serve", settings.serve)]


def _read(job: Job, settings: JudgeSettings) -> None:
    """Step 3: the job's scores from its body, or judge_unparsable."""
    try:
        text = reply_text(job.body)
        job.scores = parse_group(text, len(job.rows), settings) if settings.mode == "group" else \
            [parse_pointwise(text, settings)] * len(job.rows)
    except Unparsable as exc:
        job.kind, job.message = "judge_unparsable", str(exc)


def answer(jobs: list[Job], settings: JudgeSettings, cache) -> None:
    """Step 2 and 3: every job's body, from the cache or the judge, and its scores or failure kind."""
    from .client import ask_all

    for job in jobs:
        body = cache.get(job.key)
        if body is not None:
            job.cached, job.body = True, body
    asked = [job for job in jobs if not job.cached]
    for job, reply in zip(asked, ask_all(base_url(settings), [job.request for job in asked], settings)):
        job.body, job.kind, job.message, job.attempts, job.seconds = (reply.body, reply.kind, reply.message,
                                                                     reply.attempts, reply.seconds)
        if reply.kind == "ok":
            cache.put(job.key, job.request, reply.body)
    for job in jobs:
        if job.kind == "ok":
            _read(job, settings)


def log_records(jobs: list[Job], context: RewardContext | None) -> list[dict]:
    """Step 4: one line per request."""
    step, phase = (context.step, context.phase) if context else (None, "")
    return [{"phase": phase, "step": step, "indices": [context.indices[i] for i in job.rows] if context else job.rows,
             "uids": [context.uids[i] for i in job.rows] if context else [], "key": job.key, "request": job.request,
             "reply": job.body, "kind": job.kind, "message": job.message, "scores": job.scores,
             "cached": job.cached, "attempts": job.attempts, "seconds": round(job.seconds, 4), "time": time.time()}
            for job in jobs]


def judge(prompts: list[str], responses: list[str], samples: list[dict], settings: JudgeSettings,
          context: RewardContext | None = None) -> list:
    """Each row's {"score", "judge_cached"}, its fallback's score, or a CallError with its failure kind."""
    from .store import append_log

    n = len(responses)
    uids = list(context.uids) if context else [str(i) for i in range(n)]
    jobs = plan_jobs(prompts, responses, samples, uids, settings)
    run_dir = context.run_dir if context else ""
    answer(jobs, settings, _cache(settings, run_dir))
    if settings.log and run_dir:
        append_log(Path(run_dir) / "judge" / "requests.jsonl", log_records(jobs, context))
    out: list[Any] = [None] * n
    for job in jobs:
        for position, i in enumerate(job.rows):
            out[i] = {"score": job.scores[position], "judge_cached": float(job.cached)} if job.kind == "ok" else \
                CallError(job.kind, f"{job.kind}: {job.message}")
    failed = [i for i, value in enumerate(out) if isinstance(value, CallError)]
    if settings.fallback:
        _score_fallback(out, failed, prompts, responses, samples, settings)
    return out


def _score_fallback(out: list, failed: list[int], prompts, responses, samples, settings: JudgeSettings) -> None:
    """Step 5 with a fallback: each failed row's score from it, with fallback/<kind> = 1 (0 for the other kinds
    and on every judged row); a fallback that fails too leaves the row failed, both messages kept."""
    from nanoverl_core.reward import BATCHED_STYLES, call_batched, call_checked, call_style

    for i, value in enumerate(out):
        kind = value.kind if isinstance(value, CallError) else ""
        flags = {f"fallback/{k}": float(k == kind) for k in ERROR_KINDS}
        if not kind:
            out[i] = {**value, **flags}
    fn, spec = _fallback(settings)
    style = call_style(fn)
    calls = [(prompts[i], responses[i], samples[i], samples[i].get("data_source", "default")) for i in failed]
    if style in BATCHED_STYLES:
        outcomes = call_batched(fn, style, spec, calls, settings.prompt_key)
    else:
        outcomes = []
        for call in calls:
            try:
                outcomes.append(("ok", *call_checked(fn, style, spec, *call)))
            except CallError as exc:
                outcomes.append((exc.kind, exc.message, None))
    for i, (kind, value, _) in zip(failed, outcomes):
        error = out[i]
        flags = {f"fallback/{k}": float(k == error.kind) for k in ERROR_KINDS}
        out[i] = {"score": value, **flags} if kind == "ok" else \
            CallError(error.kind, f"{error.message}; the fallback {settings.fallback} failed too ({kind}: {value})")


def _fallback(settings: JudgeSettings):
    """(function, ComponentSpec) of `fallback`: a file's function, or a registered reward with its default
    settings; loaded once per process."""
    from nanoverl_core.reward import ComponentSpec, load_function

    name = settings.fallback
    if ("fallback", name) not in _OPEN:
        if ":" in name:
            file, function = name.rsplit(":", 1)
            spec = ComponentSpec(name, file=file, function=function)
            fn = load_function(spec)
        else:
            from nanoverl_core import load_registry
            registry = load_registry()
            fn = registry.get("reward", name, key="reward.judge.fallback")
            cls = registry.settings_class("reward", name)
            spec = ComponentSpec(name, name=name, settings=cls() if cls is not None else None)
        _OPEN[("fallback", name)] = (fn, spec)
    return _OPEN[("fallback", name)]


judge.batched = True                # once per step, in the batched rewards' worker process
judge.error_kinds = ERROR_KINDS     # reward/errors/<kind>, logged every step
judge.check_config = check_config   # the dry-run checks (settings.py)
