"""Agent worker processes: each runs its share of a batch's agents at once, and reports every result to
the endpoint as it comes (no torch here).

A worker is a `nanoverl_core.processes` worker (a fresh interpreter that dies with the trainer). It gets
one call per batch: its episodes, each a (episode id, data row) pair. All of them run concurrently in
one asyncio loop: an `async def` agent as a task, a plain function in a thread, a program
(`agent.command`) as a subprocess in its own session. Each gets a client whose base URL is its own
episode's (`.../e/<id>/v1`) and the run's key: an `openai.OpenAI` (`AsyncOpenAI` for an async agent)
without retries, or `OPENAI_BASE_URL` / `OPENAI_API_KEY` in a program's environment, with the row as
JSON in `NANOVERL_ROW` and on its stdin. A program reports its reward as the last line of its stdout
(a JSON number, `null`, or an object with "reward").

When an agent ends (returns, raises, runs past `agent.timeout_s`, or a program exits), its outcome is
POSTed to the endpoint (`/nanoverl/episodes/<id>/result`), so the trainer knows at once which agents still
run. A thread cannot be stopped: a worker left with a thread that outlived its deadline asks to be
replaced (the pool kills it). The pool's own time limit (agent.timeout_s plus a grace) catches a worker
that hangs outright; a worker that dies costs the agents it was running (`crash`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..processes import serve

GRACE_S = 10.0
"""How long past agent.timeout_s the pool waits for a worker before killing it."""


def outcome_of(value: Any) -> dict[str, Any]:
    """An agent's return value as an outcome: a number or None (scoring left to [reward]) or {"reward": ...}."""
    if isinstance(value, dict) and set(value) <= {"reward", "info"}:
        info = value.get("info") or {}
        if not isinstance(info, dict) or not all(isinstance(v, (int, float)) for v in info.values()):
            return {"kind": "invalid", "message": "the agent's 'info' must map names to numbers"}
        return {**outcome_of(value.get("reward")), "info": {str(k): float(v) for k, v in info.items()}}
    if value is None:
        return {"kind": "ok", "reward": None}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return {"kind": "ok", "reward": float(value)}
    return {"kind": "invalid", "message": f"the agent returned {str(value)[:200]!r}; return a finite number, None, "
                                          "or {'reward': ..., 'info': {...}}"}


class Agents:
    """The agents of one worker and how to run a batch of them."""

    def __init__(self, source, settings, root: str, key: str, timeout_s: float):
        self.source, self.settings, self.root, self.key, self.timeout_s = source, settings, root, key, timeout_s
        self.fn = source.load()
        self.threads = ThreadPoolExecutor(max_workers=256, thread_name_prefix="agent")
        self.stray = False
        self.http = None
        """One connection pool the plain agents' clients share (each client of its own would open its own)."""

    def __call__(self, call: tuple) -> tuple[Any, bool]:
        _, episodes = call
        asyncio.run(self._batch(episodes))
        return None, self.stray

    async def _batch(self, episodes: list[tuple[str, dict]]) -> None:
        import httpx
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        if self.http is None and self.fn is not None and not inspect.iscoroutinefunction(self.fn):
            import openai
            self.http = openai.DefaultHttpxClient(limits=limits)
        async with httpx.AsyncClient(timeout=30.0, limits=limits) as http:
            await asyncio.gather(*(self._one(http, eid, row) for eid, row in episodes))

    async def _one(self, http, eid: str, row: dict) -> None:
        base_url = f"{self.root}/e/{eid}/v1"
        try:
            outcome = await asyncio.wait_for(self._run(base_url, row), self.timeout_s or None)
        except asyncio.TimeoutError:
            outcome = {"kind": "timeout", "message": f"the agent ran past agent.timeout_s={self.timeout_s:g}s"}
        except Exception as exc:  # the agent's own exception
            outcome = {"kind": "raised", "message": f"raised {type(exc).__name__}: {str(exc)[:500]}"}
        await http.post(f"{self.root}/nanoverl/episodes/{eid}/result", json=outcome,
                        headers={"Authorization": f"Bearer {self.key}"})

    async def _run(self, base_url: str, row: dict) -> dict:
        if self.fn is None:
            return await self._program(base_url, row)
        import openai
        kwargs = {"settings": self.settings} if self.settings is not None else {}
        if inspect.iscoroutinefunction(self.fn):
            client = openai.AsyncOpenAI(base_url=base_url, api_key=self.key, max_retries=0, timeout=self.timeout_s or None)
            async with client:
                return outcome_of(await self.fn(row, client, **kwargs))
        client = openai.OpenAI(base_url=base_url, api_key=self.key, max_retries=0, timeout=self.timeout_s or None,
                               http_client=self.http)
        future = asyncio.get_running_loop().run_in_executor(self.threads, lambda: self.fn(row, client, **kwargs))
        try:
            return outcome_of(await asyncio.shield(future))
        except asyncio.CancelledError:
            self.stray = not future.done()   # the thread runs on: this worker is replaced after the batch
            raise

    async def _program(self, base_url: str, row: dict) -> dict:
        text = json.dumps(row, default=str)
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": self.key, "NANOVERL_ROW": text}
        proc = await asyncio.create_subprocess_exec(*self.source.command, env=env, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    start_new_session=True, preexec_fn=_die_with_worker)
        try:
            out, err = await proc.communicate(text.encode())
        finally:
            if proc.returncode is None:           # cancelled at the deadline: the program and its children go
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return {"kind": "raised", "message": f"the program exited with status {proc.returncode}: {tail[0][:300]}"}
        lines = out.decode(errors="replace").strip().splitlines()
        if not lines:
            return outcome_of(None)
        try:
            return outcome_of(json.loads(lines[-1]))
        except json.JSONDecodeError:
            return {"kind": "invalid", "message": f"the program's last line of output is not JSON: {lines[-1][:200]!r}"}


def _die_with_worker() -> None:
    """In an agent program, before it starts: SIGKILL when its worker dies (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def _agents(init) -> Any:
    return Agents(*init)


if __name__ == "__main__":  # one module object: the classes a message unpickles are this module's own
    from nanoverl_core.agents.runner import _agents
    sys.exit(serve(_agents))
