"""Posting the step's requests to the judge: at most `concurrency` in flight, each with a timeout and retries.

Each request ends in a `Reply`: kind "ok" with the body of an HTTP 200, or the kind of its last failed attempt:

    judge_timeout      no answer within timeout_s (connect, send, wait or read)
    judge_unreachable  no connection, or the connection dropped (server down, killed mid-request)
    judge_http         an HTTP status other than 200 (408, 429 and 5xx are retried, others are not)

(`judge_unparsable`, a 200 whose text holds no score, is the reward's to decide: reward.py.)
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import attrs
import httpx

from .settings import JudgeSettings

RETRIED_STATUS = (408, 429)
"""HTTP statuses retried besides 5xx."""


@attrs.frozen
class Reply:
    kind: str
    """"ok", "judge_timeout", "judge_unreachable" or "judge_http"."""
    body: str = ""
    """The reply body as received (an HTTP error's too, cut to 2,000 characters)."""
    message: str = ""
    """What went wrong, for a failed request."""
    attempts: int = 1
    seconds: float = 0.0


def headers(settings: JudgeSettings) -> dict[str, str]:
    """The request headers; the key, read from the environment here, goes nowhere else."""
    key = os.environ.get(settings.api_key_env, "") if settings.api_key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _attempt(client: httpx.AsyncClient, url: str, request: dict, settings: JudgeSettings) -> Reply:
    try:
        response = await client.post(url, json=request, headers=headers(settings), timeout=settings.timeout_s)
    except httpx.TimeoutException as exc:
        return Reply("judge_timeout", message=f"no reply within timeout_s={settings.timeout_s:g}s "
                                              f"({type(exc).__name__})")
    except httpx.TransportError as exc:
        return Reply("judge_unreachable", message=f"{type(exc).__name__}: {str(exc)[:200]}")
    if response.status_code == 200:
        return Reply("ok", response.text)
    return Reply("judge_http", response.text[:2000], f"HTTP {response.status_code}: {response.text[:200]!r}")


def _retried(reply: Reply) -> bool:
    if reply.kind in ("judge_timeout", "judge_unreachable"):
        return True
    if reply.kind == "judge_http":
        status = int(reply.message.split()[1].rstrip(":"))
        return status >= 500 or status in RETRIED_STATUS
    return False


async def ask(client: httpx.AsyncClient, gate: asyncio.Semaphore, url: str, request: dict,
              settings: JudgeSettings) -> Reply:
    """One request with up to `retries` further attempts (0.5 s, 1 s, 2 s, ... at most 8 s apart)."""
    start = time.monotonic()
    async with gate:
        for attempt in range(settings.retries + 1):
            reply = await _attempt(client, url, request, settings)
            if reply.kind == "ok" or not _retried(reply) or attempt == settings.retries:
                break
            await asyncio.sleep(min(0.5 * 2 ** attempt, 8.0))
    return attrs.evolve(reply, attempts=attempt + 1, seconds=time.monotonic() - start)


async def _ask_all(base_url: str, requests: list[dict[str, Any]], settings: JudgeSettings) -> list[Reply]:
    url = base_url.rstrip("/") + "/chat/completions"
    gate = asyncio.Semaphore(settings.concurrency)
    limits = httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
        return list(await asyncio.gather(*(ask(client, gate, url, r, settings) for r in requests)))


def ask_all(base_url: str, requests: list[dict[str, Any]], settings: JudgeSettings) -> list[Reply]:
    """Every request's Reply, in order, `settings.concurrency` at a time."""
    if not requests:
        return []
    return asyncio.run(_ask_all(base_url, requests, settings))
