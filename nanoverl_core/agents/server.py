"""The OpenAI-compatible endpoint: FastAPI routes served by uvicorn in a thread of the trainer process.

    GET  /e/<episode>/v1/models
    POST /e/<episode>/v1/chat/completions
    POST /e/<episode>/v1/completions
    POST /nanoverl/episodes/<episode>/result      an agent worker reports how its agent ended

Every agent gets its own episode's base URL and the run's key (`Authorization: Bearer <key>`, a fresh
random one per run), so each call is charged to its episode. The server listens on 127.0.0.1 only. A
route hands the request to the `host` (agents/rollout.py), which renders it, queues it for the engine
and resolves a `concurrent.futures.Future` once the engine has sampled; errors come back in OpenAI's
format, `{"error": {"message", "type", "param", "code"}}`, with its status codes.
"""

from __future__ import annotations

import asyncio
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .transcript import CallRefused


def _error(status: int, code: str, message: str) -> JSONResponse:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(status,
                                                                                             "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def make_app(host, key: str) -> FastAPI:
    """The FastAPI app; `host` has `model`, `submit(episode, route, body) -> Future` and `ended(episode, outcome)`."""
    app = FastAPI(title="nanoverl agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if request.headers.get("authorization", "") != f"Bearer {key}":
            return _error(401, "invalid_api_key", "a wrong or missing API key: use the key the agent was given "
                                                  "(OPENAI_API_KEY)")
        return await call_next(request)

    @app.exception_handler(CallRefused)
    async def refused(request: Request, exc: CallRefused):
        return _error(exc.status, exc.code, str(exc))

    @app.get("/e/{episode}/v1/models")
    async def models(episode: str):
        return {"object": "list", "data": [{"id": host.model, "object": "model", "created": 0, "owned_by": "nanoverl"}]}

    async def sample(episode: str, route: str, request: Request):
        try:
            body = await request.json()
        except ValueError:
            raise CallRefused(400, "invalid_json", "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise CallRefused(400, "invalid_json", "the request body must be a JSON object")
        return await asyncio.wrap_future(host.submit(episode, route, body))

    @app.post("/e/{episode}/v1/chat/completions")
    async def chat(episode: str, request: Request):
        return await sample(episode, "chat", request)

    @app.post("/e/{episode}/v1/completions")
    async def completions(episode: str, request: Request):
        return await sample(episode, "completions", request)

    @app.post("/nanoverl/episodes/{episode}/result")
    async def result(episode: str, request: Request):
        host.ended(episode, await request.json())
        return {"ok": True}

    return app


class Endpoint:
    """uvicorn serving `make_app(host, key)` on 127.0.0.1 (a free port) in a daemon thread, until `close`."""

    def __init__(self, host, key: str):
        import uvicorn
        config = uvicorn.Config(make_app(host, key), host="127.0.0.1", port=0, log_level="warning",
                                access_log=False, timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="nanoverl-endpoint", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the agent endpoint did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
