"""The `judge` reward's throughput: requests per second by concurrency, and the cache on a repeated run; JSON.

    python benchmarks/judge_throughput.py [--requests 256] [--latency-ms 200] [--concurrency 1 8 32]
                                          [--serve MODEL_FOLDER --model-requests 32]

Part 1, the client: a judge server on 127.0.0.1 that answers every request after `--latency-ms` (a remote
API's latency, no model), `--requests` distinct pointwise requests through `nanoverl_judge.reward.judge`
(called as the runtime calls it, one step), at each `--concurrency`: requests per second. Then the same step
again on the same cache (a repeated or resumed run): the hit rate, the requests the server saw (0), and the
seconds. Part 2 (`--serve`): the same through a local model the reward serves itself (greedy, 8 new tokens,
`serve_batch_size` 8), at concurrency 1 and 8.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve_latency(port_file: str, latency_ms: float, count_file: str) -> None:
    """A chat-completions server answering "Score: 7" after latency_ms; counts requests in count_file."""
    import uvicorn
    from fastapi import FastAPI

    app, seen = FastAPI(), {"n": 0}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": []}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        seen["n"] += 1
        Path(count_file).write_text(str(seen["n"]))
        await asyncio.sleep(latency_ms / 1000)
        return {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                   "content": "Score: 7"}}]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(512)
    Path(port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off")).run(sockets=[sock])


def start_latency_server(tmp: Path, latency_ms: float):
    port_file, count_file = tmp / "port", tmp / "count"
    proc = subprocess.Popen([sys.executable, __file__, "--_serve", str(port_file), str(latency_ms), str(count_file)])
    while not port_file.is_file() or not port_file.read_text():
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port_file.read_text()}/v1"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/models", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    return proc, url, count_file


def one_step(settings, n: int, run_dir: Path, offset: int = 0) -> tuple[float, list]:
    from nanoverl_core.reward import RewardContext
    from nanoverl_judge.reward import judge

    rows = [{"prompt": f"What is {i} + 1?", "target": str(i + 1)} for i in range(offset, offset + n)]
    context = RewardContext("train", 1, str(run_dir), tuple(map(str, range(n))), tuple(range(n)))
    start = time.perf_counter()
    out = judge([r["prompt"] for r in rows], [f"The answer is {i}." for i in range(n)], rows, settings, context)
    return time.perf_counter() - start, out


def client_part(args, tmp: Path) -> dict:
    from nanoverl_judge.settings import JudgeSettings

    proc, url, count_file = start_latency_server(tmp, args.latency_ms)
    try:
        by_concurrency = {}
        for c in args.concurrency:
            settings = JudgeSettings(base_url=url, model="bench", concurrency=c, cache=False, log=False)
            seconds, _ = one_step(settings, args.requests, tmp / f"c{c}")
            by_concurrency[c] = {"seconds": round(seconds, 3), "requests_per_s": round(args.requests / seconds, 1)}
        settings = JudgeSettings(base_url=url, model="bench", concurrency=max(args.concurrency))
        first, _ = one_step(settings, args.requests, tmp / "cached")
        seen = int(count_file.read_text())
        again, out = one_step(settings, args.requests, tmp / "cached")
        hits = sum(o["judge_cached"] for o in out) / len(out)
        return {"latency_ms": args.latency_ms, "requests": args.requests, "by_concurrency": by_concurrency,
                "repeated_run": {"first_seconds": round(first, 3), "again_seconds": round(again, 3),
                                 "cache_hit_rate": hits, "requests_sent_again": int(count_file.read_text()) - seen,
                                 "cached_requests_per_s": round(args.requests / again, 1)}}
    finally:
        proc.kill()
        proc.wait()


def model_part(args, tmp: Path) -> dict:
    from nanoverl_judge.reward import base_url
    from nanoverl_judge.settings import JudgeSettings

    out = {"model": args.serve, "requests": args.model_requests, "max_tokens": 8}
    start = time.perf_counter()
    base_url(JudgeSettings(serve=args.serve))           # started once and kept, as in a run
    out["server_start_seconds"] = round(time.perf_counter() - start, 1)
    for c in (1, 8):
        settings = JudgeSettings(serve=args.serve, concurrency=c, max_tokens=8, timeout_s=600, cache=False, log=False)
        seconds, replies = one_step(settings, args.model_requests, tmp / f"m{c}", offset=1000 * c)
        out[f"concurrency_{c}"] = {"seconds": round(seconds, 2), "requests_per_s": round(args.model_requests / seconds, 2)}
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_serve":
        serve_latency(sys.argv[2], float(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--serve", default="")
    parser.add_argument("--model-requests", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"cpu_count": os.cpu_count(), "client": client_part(args, Path(tmp))}
        if args.serve:
            result["served_model"] = model_part(args, Path(tmp))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
