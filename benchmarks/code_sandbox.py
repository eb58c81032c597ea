"""Executions per second of the `code` reward's sandbox against a plain subprocess (needs nanoverl-code).

    python benchmarks/code_sandbox.py [--parallel 2] [--seconds 10]

Two programs: a trivial one (`print(1)` on stdin/stdout) and a HumanEval-style solution checked by its
`check(candidate)` (assert mode: the program's process and the checker's). Each is run `--seconds` long by
`--parallel` threads, each execution one row of one test case:

    sandbox   nanoverl_code.sandbox.run_tests: launcher, namespaces, read-only root, init, program (and checker)
    plain     subprocess.run([python, "-I", "-c", program + test]) with rlimits only: what a local executor
              without isolation costs (verl's prime_code runs so), the baseline of the overhead

One JSON object per program and mode on stdout, then a summary with the overhead (plain / sandbox rate).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

from nanoverl_code.sandbox import Limits, interpreter, run_tests

SOLUTION = '''
def separate_paren_groups(paren_string: str) -> list:
    result, current, depth = [], [], 0
    for c in paren_string:
        if c == "(":
            depth += 1
            current.append(c)
        elif c == ")":
            depth -= 1
            current.append(c)
            if depth == 0:
                result.append("".join(current))
                current.clear()
    return result
'''
TEST = '''
def check(candidate):
    assert candidate("(()()) ((())) () ((())()())") == ["(()())", "((()))", "()", "((())()())"]
    assert candidate("() (()) ((())) (((())))") == ["()", "(())", "((()))", "(((())))"]
    assert candidate("(()(())((())))") == ["(()(())((())))"]
    assert candidate("( ) (( )) (( )( ))") == ["()", "(())", "(()())"]
'''
PROGRAMS = {"trivial": ("print(1)", "stdio"), "humaneval": (SOLUTION, "assert")}


def sandboxed(name: str) -> bool:
    program, mode = PROGRAMS[name]
    if mode == "stdio":
        out = run_tests(program, "stdio", [{"stdin": ""}])[0]
        return out.kind == "ok" and out.stdout == b"1\n"
    return run_tests(program, "assert", [{"code": TEST}], entry="separate_paren_groups")[0].kind == "ok"


def _limits() -> None:
    limits = Limits()
    resource.setrlimit(resource.RLIMIT_CPU, (int(limits.cpu_s), int(limits.cpu_s) + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20,) * 2)


def plain(name: str) -> bool:
    program, mode = PROGRAMS[name]
    source = program if mode == "stdio" else program + TEST + "\ncheck(separate_paren_groups)\n"
    proc = subprocess.run([interpreter("")[0], "-I", "-c", source], capture_output=True, timeout=10, env={},
                          preexec_fn=_limits)
    return proc.returncode == 0 and (mode != "stdio" or proc.stdout == b"1\n")


def rate(fn, name: str, parallel: int, seconds: float) -> dict:
    counts, failures = [0] * parallel, [0] * parallel
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            if fn(name):
                counts[i] += 1
            else:
                failures[i] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    return {"program": name, "mode": fn.__name__, "parallel": parallel, "executions": sum(counts),
            "failures": sum(failures), "seconds": round(elapsed, 2), "per_s": round(sum(counts) / elapsed, 1),
            "ms_each": round(1000 * elapsed * parallel / max(1, sum(counts)), 1)}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1, help="threads (default: the cores)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per program and mode")
    args = parser.parse_args(argv)
    rows = []
    for name in PROGRAMS:
        for fn in (sandboxed, plain):
            fn(name)  # warm the page cache
            rows.append(rate(fn, name, args.parallel, args.seconds))
            print(json.dumps(rows[-1]), flush=True)
    by = {(r["program"], r["mode"]): r["per_s"] for r in rows}
    summary = {"summary": True, "cpu": cpu_model(), "cores": os.cpu_count(), "parallel": args.parallel,
               "python": sys.version.split()[0], "uid": os.getuid(),
               **{f"overhead_{name}": round(by[(name, "plain")] / max(by[(name, "sandboxed")], 1e-9), 2)
                  for name in PROGRAMS}}
    print(json.dumps(summary))
    return 0 if all(r["failures"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
