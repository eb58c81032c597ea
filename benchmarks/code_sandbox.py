"""Executions per second of the `code` reward's sandbox against a plain subprocess (needs nanoverl-code).

    python benchmarks/code_sandbox.py [--parallel 2] [--seconds 10] [--rounds 1]
    python benchmarks/code_sandbox.py --baseline DIR --rounds 3    # against another copy of nanoverl_code

Two programs: a trivial one (`print(1)` on stdin/stdout) and a HumanEval-style solution checked by its
`check(candidate)` (assert mode: the program's process and the checker's). Each is run `--seconds` long by
`--parallel` threads, each execution one row of one test case:

    sandbox   nanoverl_code.sandbox.run_tests as the reward calls it by default: namespaces, a cgroup per test
              case, seccomp, the read-only root, the reaper, the program (and the checker)
    plain     subprocess.run([python, "-I", "-c", program + test]) with rlimits only: what a local executor
              without isolation costs (verl's prime_code runs so), the baseline of the overhead
    baseline  (--baseline DIR) the same run_tests of the nanoverl_code package in DIR (e.g. a `git worktree`
              of an older commit's plugins/nanoverl-code/src), in a child process, rounds interleaved

One JSON object per program, mode and round on stdout, then a summary: the overhead (plain / sandbox rate)
and, with --baseline, the cost (baseline / sandbox rate), medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

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
    from nanoverl_code.sandbox import run_tests
    program, mode = PROGRAMS[name]
    if mode == "stdio":
        out = run_tests(program, "stdio", [{"stdin": ""}])[0]
        return out.kind == "ok" and out.stdout == b"1\n"
    return run_tests(program, "assert", [{"code": TEST}], entry="separate_paren_groups")[0].kind == "ok"


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (2, 3))
    resource.setrlimit(resource.RLIMIT_AS, (512 << 20,) * 2)


def plain(name: str) -> bool:
    from nanoverl_code.sandbox import interpreter
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

    fn(name)  # warm the page cache and the caches of the process
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


def baseline(name: str, folder: str, parallel: int, seconds: float) -> dict:
    """The same measurement of the nanoverl_code in `folder`, in a child process."""
    env = {**os.environ, "PYTHONPATH": folder}
    proc = subprocess.run([sys.executable, __file__, "--measure", name, "--parallel", str(parallel),
                           "--seconds", str(seconds)], capture_output=True, text=True, env=env, check=True)
    return {**json.loads(proc.stdout.splitlines()[-1]), "mode": "baseline"}


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
    parser.add_argument("--seconds", type=float, default=10.0, help="per program, mode and round")
    parser.add_argument("--rounds", type=int, default=1, help="repetitions, modes interleaved")
    parser.add_argument("--baseline", help="a folder holding another nanoverl_code package to compare against")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the child of --baseline: one sandboxed rate
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(rate(sandboxed, args.measure, args.parallel, args.seconds)))
        return 0
    rows = []
    for r in range(args.rounds):
        for name in PROGRAMS:
            modes = [lambda: rate(sandboxed, name, args.parallel, args.seconds),
                     lambda: rate(plain, name, args.parallel, args.seconds)]
            if args.baseline:
                modes.append(lambda: baseline(name, args.baseline, args.parallel, args.seconds))
            for measure in modes if r % 2 == 0 else modes[::-1]:
                rows.append({**measure(), "round": r})
                print(json.dumps(rows[-1]), flush=True)

    def median(name: str, mode: str) -> float:
        return statistics.median(x["per_s"] for x in rows if (x["program"], x["mode"]) == (name, mode))

    summary = {"summary": True, "cpu": cpu_model(), "cores": os.cpu_count(), "parallel": args.parallel,
               "python": sys.version.split()[0], "uid": os.getuid(), "rounds": args.rounds,
               **{f"overhead_{name}": round(median(name, "plain") / max(median(name, "sandboxed"), 1e-9), 2)
                  for name in PROGRAMS}}
    if args.baseline:
        summary.update({f"cost_vs_baseline_{name}": round(median(name, "baseline") /
                                                          max(median(name, "sandboxed"), 1e-9), 2)
                        for name in PROGRAMS})
    print(json.dumps(summary))
    return 0 if all(r["failures"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
