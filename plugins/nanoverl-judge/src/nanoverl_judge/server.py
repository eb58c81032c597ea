"""A local Hugging Face causal LM behind an OpenAI-compatible /v1/chat/completions, on 127.0.0.1.

    python -m nanoverl_judge.server --model FOLDER [--port 0] [--batch-size 8] [--request-log FILE]

The judge reward starts one (`[reward.judge] serve = FOLDER`) from its worker process, which it dies with
(PR_SET_PDEATHSIG); the tests serve a tiny random Llama through it. Each request's messages are rendered with
the tokenizer's chat template (a plain "role: content" transcript when it has none) and decoded greedily
(`temperature` is ignored: a judge asks for 0) up to `max_tokens`; requests that arrive together are
decoded together, left-padded, `--batch-size` at a time. The bound port is printed as `port <N>` on stdout.
`--request-log` appends every request body as one JSON line (the tests count requests with it).
"""


import argparse
import asyncio
import json
import queue
import socket
import sys
import threading
import time
from concurrent.futures import Future


def _render(tokenizer, messages: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


class Generator:
    """The model, and one thread decoding queued requests in batches."""

    def __init__(self, folder: str, batch_size: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)  # a folder without weights (a tiny test model) initialises the same every time
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.batch_size = batch_size
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, messages: list[dict], max_tokens: int) -> Future:
        future: Future = Future()
        self.queue.put((_render(self.tokenizer, messages), max_tokens, future))
        return future

    def _loop(self) -> None:
        while True:
            jobs = [self.queue.get()]
            time.sleep(0.005)  # let the requests sent together arrive together
            while len(jobs) < self.batch_size and not self.queue.empty():
                jobs.append(self.queue.get())
            try:
                outputs = self._generate([j[0] for j in jobs], max(j[1] for j in jobs))
                for (_, max_tokens, future), ids in zip(jobs, outputs):
                    future.set_result(self._cut(ids, max_tokens))
            except Exception as exc:  # the request fails with HTTP 500, the server goes on
                for *_, future in jobs:
                    future.set_exception(exc)

    def _cut(self, ids: list[int], max_tokens: int) -> tuple[str, int, str]:
        ids = ids[:max_tokens]
        eos = self.tokenizer.eos_token_id
        finish = "length"
        if eos in ids:
            ids, finish = ids[:ids.index(eos)], "stop"
        return self.tokenizer.decode(ids, skip_special_tokens=True), len(ids), finish

    def _generate(self, prompts: list[str], max_tokens: int) -> list[list[int]]:
        import torch

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=max_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        return out[:, enc["input_ids"].shape[1]:].tolist()


def make_app(generator: "Generator", name: str, request_log: str = ""):
    # no `from __future__ import annotations` in this module: FastAPI reads `request: Request` at runtime
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI()
    lock = threading.Lock()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "nanoverl"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if request_log:
            with lock, open(request_log, "a") as f:
                f.write(json.dumps(body, sort_keys=True) + "\n")
        messages, max_tokens = body.get("messages"), int(body.get("max_tokens") or 256)
        if not isinstance(messages, list) or not messages:
            return JSONResponse({"error": {"message": "messages must be a non-empty list"}}, status_code=400)
        text, count, finish = await asyncio.wrap_future(generator.submit(messages, max_tokens))
        return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": {"completion_tokens": count}}

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanoverl_judge.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face causal LM folder")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--name", default="local", help="the model id /v1/models lists")
    parser.add_argument("--request-log", default="", help="append each request body to this file")
    args = parser.parse_args(argv)
    import uvicorn

    app = make_app(Generator(args.model, args.batch_size), args.name, args.request_log)
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    print(f"port {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.run(sockets=[sock])
    return 0


def start(folder: str, batch_size: int = 8, *, request_log: str = "", timeout_s: float = 300.0):
    """(process, base_url) of a server on `folder`, started from this process and dying with it; waits until
    it answers. A RewardError if it exits or does not answer within timeout_s."""
    import subprocess
    import tempfile

    from nanoverl_core.errors import RewardError

    def die_with_parent():
        import ctypes
        import signal
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    cmd = [sys.executable, "-m", "nanoverl_judge.server", "--model", folder, "--batch-size", str(batch_size),
           *(["--request-log", request_log] if request_log else [])]
    errors = tempfile.TemporaryFile("w+")  # a file, not a pipe nobody reads: a chatty model cannot block it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True, preexec_fn=die_with_parent)
    line = proc.stdout.readline()
    if not line.startswith("port "):
        proc.kill()
        proc.wait()
        errors.seek(0)
        detail = " ".join(errors.read().split())[-400:]
        raise RewardError(f"reward.judge.serve = {folder!r}: the judge server did not start ({detail})")
    base_url = f"http://127.0.0.1:{int(line.split()[1])}/v1"
    _wait(proc, base_url, timeout_s, folder)
    return proc, base_url


def wait_until_up(base_url: str, proc=None, timeout_s: float = 60) -> str | None:
    """Poll `base_url`/models until the server answers: None, or why it never did (`proc` exited, or the time
    ran out)."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return f"the judge server exited ({proc.returncode})"
        try:
            with urllib.request.urlopen(base_url + "/models", timeout=2):
                return None
        except OSError:
            time.sleep(0.05)
    return f"the judge server did not answer within {timeout_s:g}s"


def _wait(proc, base_url: str, timeout_s: float, folder: str) -> None:
    from nanoverl_core.errors import RewardError

    why = wait_until_up(base_url, proc, timeout_s)
    if why is not None:
        proc.kill()
        raise RewardError(f"reward.judge.serve = {folder!r}: {why}")


if __name__ == "__main__":
    sys.exit(main())
