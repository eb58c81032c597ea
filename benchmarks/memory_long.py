"""Resident memory stays flat over a long run: the slope of the trainer's RSS after warm-up.

    .venv/bin/python benchmarks/memory_long.py                    # 400 steps of the tiny task (~2 min)
    .venv/bin/python benchmarks/memory_long.py --steps 1000 --set tracking.plot.every_s=0
    .venv/bin/python benchmarks/memory_long.py --run runs/smollm2_arithmetic   # analyse a finished run

By default it runs the Quickstart job (`examples/configs/tiny_grpo.toml`) for `--steps` real trainer
steps with `nanoverl-train` in a subprocess, in a run directory under a fresh temporary folder, with
the config's trackers (console, jsonl and plot by default: a tracker that keeps what it logs is a
leak too), its reward worker processes, a checkpoint and a validation every `--every` steps (50), so
the save and validation paths run many times within the measured span; `trainer.progress=none`.
`--set section.key=value` adds overrides (after those), `--config` picks another config.
`--run DIR` reads an existing run's `metrics.jsonl` instead and runs nothing.

What is measured: `perf/rss_mib` of every step in `metrics.jsonl`, the trainer process's resident
memory at the end of the step's update (/proc/self/statm; the trainer logs it, see
nanoverl_core/trainer/trainer.py batch_metrics). The first `warmup` steps are left out (default: the
largest of 10% of the steps and 20, and, when it runs the job, `--every`), the time libraries,
allocator pools and the optimizer state take to settle, and the one-time costs of the first
checkpoint, validation and plot draw (their imports, matplotlib's fonts: ~35 MiB on the tiny task).
Over the rest, an ordinary least-squares line of RSS against the step:

  slope_mib_per_100_steps   its slope, with a 95% interval (Student's t on n - 2 degrees of freedom).
                            The residuals of RSS are not independent (the allocator moves in steps of
                            pages and arenas), so the interval is narrower than the truth; read it
                            with max_minus_min.
  slope_last_half_...       the same over the second half of the measured steps: a leak keeps its
                            rate to the end, a heap that settles (fragmentation) flattens
  growth_mib                slope x the measured span (steps after warm-up): the growth the line says
                            happened over the run
  max_minus_min_mib         the range of RSS after warm-up, whatever its shape
  verdict                   "flat" when growth_mib < threshold_mib = max(8 MiB, 2% of the RSS at the
                            end of warm-up), else "grows". 8 MiB is about the allocator's jitter on a
                            ~500 MiB CPU process (glibc arenas, torch's cached blocks); 2% lets a
                            multi-GiB process (SmolLM2, ~4 GiB) move by what one step's activations
                            leave in the heap. A per-step leak of 1 KiB (e.g. a dict of metrics kept per
                            step) stays under it; one of a batch's tensors per step does not.

When it runs the job it also samples, every `--sample-s` seconds (1 s), the resident memory of the
trainer's child processes (the reward workers), summed, while all of them are alive: at the first
sample after warm-up and the last one (children_rss_mib_after_warmup, children_rss_mib_end), and their range in between (the per-step RSS in metrics.jsonl is the
trainer's alone). Output: one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, load_average, tmpdir  # noqa: E402

PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20
METRIC = "perf/rss_mib"
THRESHOLD_MIB, THRESHOLD_FRACTION = 8.0, 0.02


def default_warmup(steps: int) -> int:
    """Steps left out at the start: the larger of 10% of the run and 20."""
    return max(20, math.ceil(0.1 * steps))


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (Cornish-Fisher expansion around
    the normal's 1.959964, Abramowitz & Stegun 26.7.5: within 0.001 from 4 degrees of freedom up;
    exact values below)."""
    exact = {1: 12.7062, 2: 4.3027, 3: 3.1824}
    if df in exact:
        return exact[df]
    z = 1.959963984540054
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares (slope, intercept, half-width of the slope's 95% interval) of ys against xs."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    if n < 3:
        return slope, intercept, math.inf
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return slope, intercept, t_quantile_975(n - 2) * math.sqrt(residual / (n - 2) / sxx)


def read_rss(metrics_file: Path) -> list[tuple[int, float]]:
    """(step, perf/rss_mib) of each step in a metrics.jsonl, in step order; a step logged twice (a
    resumed run replays the steps after its checkpoint) keeps its last line."""
    by_step: dict[int, float] = {}
    for line in metrics_file.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:            # a line cut short by a kill
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get(METRIC), (int, float)):
            by_step[row["step"]] = float(row[METRIC])
    return sorted(by_step.items())


def analyse(points: list[tuple[int, float]], warmup: int | None = None, rule: str = "") -> dict:
    """The slope of RSS against the step after `warmup` steps (default_warmup of the last step), its
    95% interval, the growth it implies over the measured span, the range, and the verdict."""
    if not points:
        raise SystemExit(f"error: no {METRIC} in the metrics (the trainer logs it from the commit that added it, "
                         "on Linux)")
    last = points[-1][0]
    if warmup is None:
        warmup, rule = default_warmup(last), "the first max(20, ceil(0.1 x steps)) steps"
    kept = [(s, r) for s, r in points if s > warmup]
    if len(kept) < 3:
        raise SystemExit(f"error: {len(kept)} steps after a warm-up of {warmup}; the slope needs 3 or more")
    steps, rss = [float(s) for s, _ in kept], [r for _, r in kept]
    slope, intercept, half = fit_line(steps, rss)
    span = steps[-1] - steps[0]
    start = rss[0]
    threshold = max(THRESHOLD_MIB, THRESHOLD_FRACTION * start)
    growth = slope * span
    half_way = len(kept) // 2            # a leak grows at the same rate to the end; a heap that settles does not
    late_slope, _, late_half = fit_line(steps[half_way:], rss[half_way:]) if len(kept) - half_way >= 3 else (
        math.nan, 0, math.nan)
    return {"steps": last, "points": len(points), "warmup_steps": warmup,
            "warmup_rule": rule or "given by --warmup",
            "measured_steps": len(kept), "rss_mib_first_step": round(points[0][1], 1),
            "rss_mib_end_of_warmup": round(start, 1), "rss_mib_end": round(rss[-1], 1),
            "rss_mib_max_after_warmup": round(max(rss), 1), "max_minus_min_mib": round(max(rss) - min(rss), 2),
            "slope_mib_per_100_steps": round(100 * slope, 4),
            "slope_95_interval_mib_per_100_steps": [round(100 * (slope - half), 4), round(100 * (slope + half), 4)],
            "slope_last_half_mib_per_100_steps": round(100 * late_slope, 4),
            "slope_last_half_95_interval_mib_per_100_steps": [round(100 * (late_slope - late_half), 4),
                                                              round(100 * (late_slope + late_half), 4)],
            "growth_mib": round(growth, 2), "threshold_mib": round(threshold, 2),
            "threshold_rule": f"growth = slope x span ({span:.0f} steps) < max({THRESHOLD_MIB:g} MiB, "
                              f"{THRESHOLD_FRACTION:.0%} of the RSS at the end of warm-up)",
            "verdict": "flat" if growth < threshold else "grows"}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc/<pid>/task/<tid>/children)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out.append(child)
                todo.append(child)
    return out


def rss_of(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_MIB
    except (OSError, ValueError, IndexError):
        return 0.0


def run_job(args) -> tuple[Path, list[tuple[float, int, float]], float]:
    """Run the job; returns its run directory, samples (seconds, processes, children's RSS) and its wall time."""
    if args.keep:
        run_dir = Path(tempfile.mkdtemp(prefix="nanoverl-bench-memory-long-")) / "run"
    else:
        run_dir = tmpdir("memory-long") / "run"
    overrides = [f"trainer.output_dir={run_dir}", f"trainer.total_steps={args.steps}", "trainer.progress=none",
                 f"trainer.save_every={args.every}", f"trainer.val_every={args.every}",
                 f"trainer.num_threads={args.threads}", *args.set]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "nanoverl_core.cli", "--config", args.config, *overrides]
    print("running: " + " ".join(command), file=sys.stderr, flush=True)
    samples, start = [], time.monotonic()
    with open(run_dir.parent / "train.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            alive = [rss for rss in map(rss_of, descendants(proc.pid)) if rss > 0]    # an exited child reads 0
            samples.append((time.monotonic() - start, len(alive), sum(alive)))
            try:
                proc.wait(timeout=args.sample_s)
            except subprocess.TimeoutExpired:
                pass
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: nanoverl-train exited with {proc.returncode}:\n"
                         + (run_dir.parent / "train.log").read_text()[-3000:])
    return run_dir, samples, wall


def children_summary(samples: list[tuple[float, int, float]], warmup_fraction: float) -> dict:
    """The reward workers' summed RSS: the first sample after the warm-up's share of the time, the last,
    and the range in between (only samples with every worker alive: not start-up and shutdown)."""
    most = max((s[1] for s in samples), default=0)
    kept = [s for s in samples if s[1] == most > 0]
    if not kept:
        return {"children": 0}
    cut = kept[0][0] + warmup_fraction * (kept[-1][0] - kept[0][0])
    after = [s for s in kept if s[0] >= cut] or kept[-1:]
    values = [s[2] for s in after]
    return {"children": most, "children_samples": len(after),
            "children_rss_mib_after_warmup": round(values[0], 1), "children_rss_mib_end": round(values[-1], 1),
            "children_max_minus_min_mib": round(max(values) - min(values), 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="analyse this run directory's metrics.jsonl (runs nothing)")
    parser.add_argument("--config", default="examples/configs/tiny_grpo.toml")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=50, help="checkpoint and validation every this many steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, help="steps left out at the start (default: max(20, 10%% of the "
                        "steps), and --every when running the job)")
    parser.add_argument("--sample-s", type=float, default=1.0, help="seconds between samples of the children's RSS")
    parser.add_argument("--keep", action="store_true", help="keep the run directory (its path is in the JSON)")
    parser.add_argument("--set", nargs="*", default=[], metavar="section.key=value", help="more config overrides")
    args = parser.parse_args(argv)
    if args.run is not None:
        metrics = args.run / "metrics.jsonl" if args.run.is_dir() else args.run
        if not metrics.is_file():
            raise SystemExit(f"error: {metrics} does not exist")
        out = {"benchmark": "memory_long", "run": str(args.run), **analyse(read_rss(metrics), args.warmup)}
    else:
        run_dir, samples, wall = run_job(args)
        warmup, rule = args.warmup, ""
        if warmup is None:          # the first checkpoint, validation and plot draw are warm-up too
            warmup = max(default_warmup(args.steps), args.every)
            rule = f"the first max(20, ceil(0.1 x steps), --every = {args.every}) steps"
        result = analyse(read_rss(run_dir / "metrics.jsonl"), warmup, rule)
        out = {"benchmark": "memory_long", "config": args.config, "overrides": args.set, "every": args.every,
               **result, "wall_s": round(wall, 1),
               **children_summary(samples, result["warmup_steps"] / max(result["steps"], 1)),
               "checkpoints_kept": sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))}
        if args.keep:
            out["run"] = str(run_dir)
    out["load"] = load_average()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
