"""Kill a training run with SIGKILL at random points, resume it each time, and check that it ends
exactly where an uninterrupted run ends.

    python scripts/kill_resume_soak.py --kills 20 --seed 0          # ~3-6 minutes on one CPU core
    python scripts/kill_resume_soak.py --kills 5 --out /tmp/soak    # what the default test run does

The run is PPO with a critic on the core's debug backends, saving every step (so a kill can land in
a rollout, an update, a checkpoint write, the pruning of old checkpoints, or the start-up of a
resume). The kill times come from a seeded RNG: four kills in five wait until the run has saved a
new step and then strike 0-2 step-times later; every fifth strikes 0.3-4 s after the start instead
(imports, clean-up of a killed save, loading the checkpoint, trimming metrics.jsonl). After each
kill the script checks that every visible `checkpoints/step_<N>` folder is complete and loadable
(weights-only), then starts the same command again (`trainer.resume=auto`). At the end, every
metrics.jsonl row except timings must equal the uninterrupted run's.

Prints a JSON summary; exit status 0 when the runs match, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nanoverl_core.testing import without_machine_metrics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "configs" / "debug_ppo.toml"
COMMON = ["trainer.progress=none", "trainer.save_every=1", "trainer.keep_checkpoints=2", "trainer.val_every=4",
          "data.batch_size=8", "rollout.n=4", "tracking.trackers=[jsonl]"]
# a complete checkpoint of the debug PPO run holds exactly these files
CHECKPOINT_FILES = {"state.json", "rng.safetensors", "actor/model.safetensors", "actor/optimizer.pt",
                    "actor/scheduler.json", "critic/model.safetensors", "critic/optimizer.pt", "critic/scheduler.json"}


def env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def command(run_dir: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "nanoverl_core.cli", "--config", str(CONFIG), *COMMON,
            f"trainer.total_steps={steps}", f"trainer.output_dir={run_dir}"]


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock keys, which differ between any two runs."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [without_machine_metrics(r) for r in rows]


def checkpoint_steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.name.startswith("step_"))


def saves_in_progress(run_dir: Path) -> set[tuple[str, int]]:
    """Temporary checkpoint folders (name, inode): a save being written, or one a kill left behind."""
    root = run_dir / "checkpoints"
    return {(e.name, e.inode()) for e in os.scandir(root) if e.name.startswith(".tmp-step_")} if root.is_dir() else set()


def check_checkpoints(run_dir: Path) -> list[str]:
    """Problems with the visible checkpoints: every step_<N> folder must be complete and load weights-only."""
    import torch
    from safetensors.torch import load_file

    problems = []
    for step in checkpoint_steps(run_dir):
        folder = run_dir / "checkpoints" / f"step_{step:06d}"
        files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        if files != CHECKPOINT_FILES:
            problems.append(f"{folder.name}: files {sorted(files ^ CHECKPOINT_FILES)} differ from a complete checkpoint")
            continue
        try:
            json.loads((folder / "state.json").read_text())
            for name in ("rng.safetensors", "actor/model.safetensors", "critic/model.safetensors"):
                load_file(str(folder / name))
            for name in ("actor/optimizer.pt", "critic/optimizer.pt"):
                torch.load(folder / name, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure is a finding
            problems.append(f"{folder.name}: does not load ({type(exc).__name__}: {exc})")
    return problems


def run_to_end(run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    return subprocess.run(command(run_dir, steps), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=900)


def soak(kills: int, seed: int = 0, out: Path | None = None, steps: int | None = None,
         log=lambda msg: None) -> dict:
    """Run the soak; returns a summary dict (`identical` is the verdict)."""
    out = Path(out or tempfile.mkdtemp(prefix="nanoverl-soak-"))
    steps = steps or 4 * kills + 5  # each kill costs 1-3 steps of progress; the rest runs to the end
    rng = random.Random(seed)
    started = time.monotonic()

    # the uninterrupted run, watched to learn how long one step plus its save takes here
    reference = out / "reference"
    child = subprocess.Popen(command(reference, steps), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    seen: dict[int, float] = {}
    while child.poll() is None:
        for step in checkpoint_steps(reference):
            seen.setdefault(step, time.monotonic())
        time.sleep(0.005)
    if child.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{child.stderr.read()[-3000:]}")
    times = sorted(seen.values())
    gaps = sorted(b - a for a, b in zip(times, times[1:])) or [0.5]
    step_time = gaps[len(gaps) // 2]  # median seconds from one saved step to the next
    log(f"reference: {steps} steps, {step_time:.2f} s per step and save")

    killed = out / "killed"
    events, problems = [], []
    for i in range(kills):
        before = checkpoint_steps(killed)
        start_step = before[-1] if before else 0
        mode = "startup" if i % 5 == 2 else "running"  # kills 3, 8, 13, 18: while the resume starts up
        delay = rng.uniform(0.3, 4.0) if mode == "startup" else rng.uniform(0.0, 2.0) * step_time
        leftovers = saves_in_progress(killed)  # left by the previous kill, until this run cleans them up
        t0 = time.monotonic()
        child = subprocess.Popen(command(killed, steps), env=env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        if mode == "running":  # wait for a newly saved step, so every kill of this kind makes progress
            deadline = time.monotonic() + 600
            while child.poll() is None and (checkpoint_steps(killed) or [0])[-1] <= start_step:
                if time.monotonic() > deadline:
                    problems.append(f"run {i} saved no new step within 600 s")
                    break
                time.sleep(0.005)
        time.sleep(delay)
        if child.poll() is not None:  # finished (or failed) before the kill
            stderr = child.stderr.read()
            events.append({"kill": i, "mode": mode, "finished_before_kill": True, "rc": child.returncode})
            if child.returncode != 0:
                problems.append(f"run {i} failed on its own (rc {child.returncode}): {stderr[-2000:]}")
            break
        tmp_present = bool(saves_in_progress(killed) - leftovers)  # this run was writing a checkpoint
        child.send_signal(signal.SIGKILL)
        child.wait()
        stderr = child.stderr.read()
        resumed = next((line for line in stderr.splitlines() if line.startswith("resumed from")), "")
        after = checkpoint_steps(killed)
        found = check_checkpoints(killed)
        problems += [f"after kill {i}: {p}" for p in found]
        if "Traceback" in stderr:
            problems.append(f"run {i} printed a traceback before the kill: {stderr[-2000:]}")
        events.append({"kill": i, "mode": mode, "delay_s": round(delay, 3), "seconds_alive": round(time.monotonic() - t0, 2),
                       "resumed_from_step": start_step if resumed else 0, "checkpoints_after": after,
                       "tmp_folder_at_kill": tmp_present})
        log(f"kill {i + 1}/{kills} ({mode}, +{delay:.2f}s): checkpoints {before} -> {after}"
            f"{', a save was in progress' if tmp_present else ''}")

    final = run_to_end(killed, steps)
    if final.returncode != 0:
        problems.append(f"the final resume failed (rc {final.returncode}): {final.stderr[-2000:]}")
    identical = final.returncode == 0 and metric_rows(killed) == metric_rows(reference)
    if final.returncode == 0 and not identical:
        a, b = metric_rows(reference), metric_rows(killed)
        diff = next((f"step {x.get('step')}: {x} != {y}" for x, y in zip(a, b) if x != y), f"{len(a)} vs {len(b)} rows")
        problems.append(f"metrics differ from the uninterrupted run: {diff[:1500]}")
    done = sum(1 for e in events if not e.get("finished_before_kill"))
    return {"kills_requested": kills, "kills": done, "seed": seed, "steps": steps,
            "seconds_per_step": round(step_time, 3),
            "kills_during_save": sum(1 for e in events if e.get("tmp_folder_at_kill")),
            "kills_during_startup": sum(1 for e in events if e["mode"] == "startup" and not e.get("finished_before_kill")),
            "final_rows": len(metric_rows(killed)) if (killed / "metrics.jsonl").exists() else 0,
            "final_reward_mean": metric_rows(killed)[-1].get("reward/mean") if final.returncode == 0 else None,
            "reference_reward_mean": metric_rows(reference)[-1].get("reward/mean"),
            "identical": identical and not problems, "problems": problems, "events": events,
            "seconds": round(time.monotonic() - started, 1), "out": str(out)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=0, help="trainer steps (default 4 * kills + 5)")
    p.add_argument("--out", type=Path, default=None, help="working folder (default: a new temporary folder)")
    args = p.parse_args(argv)
    summary = soak(args.kills, args.seed, args.out, args.steps or None,
                   log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(json.dumps(summary, indent=2))
    return 0 if summary["identical"] and summary["kills"] == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
