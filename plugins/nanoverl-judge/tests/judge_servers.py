"""Scripted OpenAI-compatible judge servers for the tests, each a real FastAPI/uvicorn process on 127.0.0.1.

    python judge_servers.py BEHAVIOUR --port-file F --log FILE [--die-after N]

BEHAVIOUR:
    exact    grades like exact match: 10 when the answer to grade equals the reference answer, else 0
             (pointwise: "Score: N"; a group rubric: "Score i: N" per answer)
    partial  pointwise, 10 x the share of the reference's characters the answer has in place (char_match)
    garbage  a chat completion whose text holds no score
    error    HTTP 500
    slow     answers after 30 s (past any test's timeout)
    mixed    one of the four above, chosen by the sha256 of the request body mod 4 (so the test can
             compute which request got which)
Every request body is appended to --log as one JSON line (sorted keys) with the behaviour it got, before it
is answered. --die-after N: the process exits (os._exit) on receiving its N-th request, without answering.
"""


import argparse
import asyncio
import hashlib
import json
import os
import re
import socket

BEHAVIOURS = ("exact", "garbage", "error", "slow")


def partial_grade(rubric: str) -> str:
    reference = re.search(r"Reference answer: (.*)", rubric).group(1).strip()
    answer = re.search(r"Answer to grade: (.*)", rubric).group(1).strip()
    hits = sum(a == b for a, b in zip(answer, reference))
    return f"Score: {10 * hits / max(len(reference), len(answer), 1):.2f}"


def behaviour_of(body: dict, behaviour: str) -> str:
    if behaviour != "mixed":
        return behaviour
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    return BEHAVIOURS[digest[0] % 4]


def exact_grade(rubric: str) -> str:
    reference = re.search(r"Reference answer: (.*)", rubric).group(1).strip()
    answers = re.findall(r"Answer (\d+):\n(.*?)(?=\n\nAnswer \d+:\n|\n\nGive each|\Z)", rubric, re.S)
    if answers:
        return "\n".join(f"Score {i}: {10 if text.strip() == reference else 0}" for i, text in answers)
    answer = re.search(r"Answer to grade: (.*)", rubric).group(1).strip()
    return f"Score: {10 if answer == reference else 0}"


def make_app(behaviour: str, log: str, die_after: int):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI()
    seen = {"n": 0}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen["n"] += 1
        got = behaviour_of(body, behaviour)
        with open(log, "a") as f:
            f.write(json.dumps({"body": body, "behaviour": got, "n": seen["n"],
                                "auth": request.headers.get("authorization")}, sort_keys=True) + "\n")
        if die_after and seen["n"] >= die_after:
            os._exit(1)
        if got == "error":
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=500)
        if got == "slow":
            await asyncio.sleep(30)
        rubric = body["messages"][-1]["content"]
        content = partial_grade(rubric) if got == "partial" else exact_grade(rubric) if got in ("exact", "slow") \
            else "I like turtles."
        return {"id": "x", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("behaviour", choices=[*BEHAVIOURS, "mixed", "partial"])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--die-after", type=int, default=0)
    args = parser.parse_args()
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    app = make_app(args.behaviour, args.log, args.die_after)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off")).run(sockets=[sock])


if __name__ == "__main__":
    main()
