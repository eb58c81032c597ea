"""With VLLM_ENABLE_V1_MULTIPROCESSING=1 the engine core is a separate process that tensors cannot
reach, so the rollout saves the weights and has the engine reload them from disk. That process can
also die on its own (SIGKILLed here) between calls or in the middle of one (a generate, a weight
sync), or stop answering (SIGSTOP) until [rollout.vllm] timeout_s passes: the rollout restarts it
from the actor's weights once, and a second failure in a row stops the run with a message. Run in a
child process: vLLM spawns its engine core there, which needs a guarded __main__."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")

SCRIPT = """
import os, signal, sys, threading, time
import torch
sys.path.insert(0, {tests!r})
from conftest import prompt_batch
from nanoverl_core import RolloutError, SamplingParams, load_config, load_registry
from nanoverl_hf.rollout import HFRollout
from nanoverl_hf.workers import make_workers
from nanoverl_vllm import engine
from nanoverl_vllm.rollout import VLLMRollout

def main():
    torch.set_num_threads(1)
    cfg = load_config(None, ["data.train_files=[{train}]", "model.path={model}", "worker.name=hf",
                             "rollout.name=vllm", "trainer.device=cpu", "data.batch_size=2",
                             "data.max_prompt_length=16", "rollout.vllm.timeout_s={timeout}"],
                      registry=load_registry())
    workers = make_workers(cfg)
    rollout = VLLMRollout(cfg, workers)
    assert not engine.in_process()
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    batch = prompt_batch(workers.tokenizer, ["12=", "9=", "5555=", "301=", "77="])
    gen = torch.Generator().manual_seed(0)

    def perturb():                                   # an "update": the engine must follow it
        with torch.no_grad():
            for p in workers.actor.module.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)

    for step in range(2):
        perturb()
        rollout.sync_weights(workers.actor)
        got = rollout.generate(batch, greedy)["responses"]
        want = HFRollout(cfg, workers).generate(batch, greedy)["responses"]
        assert torch.equal(got, want), (step, got.tolist(), want.tolist())
    assert rollout.restarts == 0
    print("OK", len(set(map(tuple, got.tolist()))))

    # the engine core dies between two generate calls: the next one restarts it from the actor's weights
    kill_engine_core(rollout)
    assert torch.equal(rollout.generate(batch, greedy)["responses"], want) and rollout.restarts == 1
    print("RESTARTED", rollout.restarts)

    # mid-call: the core is stopped (SIGSTOP) before the call, so the call is surely waiting on it, and is
    # then SIGKILLed (after 1 s) or left stopped (killed by the deadline, {timeout} s): each call returns
    # what a healthy engine would, from a fresh engine holding the actor's current weights
    for what, kill_after in (("generate", 1.0), ("generate", None), ("sync", 1.0), ("sync", None)):
        restarts, start = rollout.restarts, time.monotonic()
        stop_core(rollout, kill_after)
        if what == "sync":
            perturb()
            rollout.sync_weights(workers.actor)
        else:
            got = rollout.generate(batch, greedy)["responses"]
        waited = time.monotonic() - start - rollout.start_s          # until the failure was noticed
        if what == "sync":
            want = HFRollout(cfg, workers).generate(batch, greedy)["responses"]
        else:
            assert torch.equal(got, want), (what, got.tolist(), want.tolist())
        assert rollout.restarts == restarts + 1, (what, kill_after, rollout.restarts)
        assert torch.equal(rollout.generate(batch, greedy)["responses"], want), (what, kill_after)
        assert rollout.restarts == restarts + 1
        print("MIDCALL", what, "killed" if kill_after else "stalled", round(waited, 1))

    # it dies again and so does the restarted engine: the run stops, saying so
    restart = rollout.restart
    def restart_and_crash(actor):
        restart(actor)
        kill_engine_core(rollout)
    rollout.restart = restart_and_crash
    kill_engine_core(rollout)
    try:
        rollout.generate(batch, greedy)
    except RolloutError as exc:
        print("STOPPED", exc)
    rollout.close()

def stop_core(rollout, kill_after):
    # SIGSTOP the engine core now and, with kill_after, SIGKILL it that many seconds later
    pid = rollout.llm.llm_engine.engine_core.resources.engine_manager.processes[0].pid
    os.kill(pid, signal.SIGSTOP)
    if kill_after is not None:
        threading.Timer(kill_after, os.kill, (pid, signal.SIGKILL)).start()

def kill_engine_core(rollout):
    # SIGKILL this process's vLLM engine-core child (its process title starts with VLLM::EngineCore)
    me = os.getpid()
    for pid in open(f"/proc/{{me}}/task/{{me}}/children").read().split():
        if open(f"/proc/{{pid}}/cmdline", "rb").read().startswith(b"VLLM::EngineCore"):
            os.kill(int(pid), signal.SIGKILL)
            # vLLM's monitor thread notices and marks the engine dead (what the rollout checks before a call)
            while not rollout.llm.llm_engine.engine_core.resources.engine_dead:
                time.sleep(0.01)
            return
    raise AssertionError("no engine-core child process")

if __name__ == "__main__":
    main()
"""


TIMEOUT = 8
"""[rollout.vllm] timeout_s of the test: longer than any healthy call of the tiny model here (~0.1 s)."""


@pytest.mark.engine
def test_weights_reach_an_engine_in_another_process_through_disk(tmp_path, tiny_dir, train_file):
    script = tmp_path / "mp_sync.py"
    tests = str(Path(__file__).parent)
    script.write_text(textwrap.dedent(SCRIPT).format(tests=tests, train=train_file, model=tiny_dir, timeout=TIMEOUT))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    ok = next(line for line in lines if line.startswith("OK"))
    assert int(ok.split()[1]) >= 3                                           # varied answers
    assert "RESTARTED 1" in lines                                            # a dead engine core is replaced
    midcall = {tuple(line.split()[1:3]): float(line.split()[3]) for line in lines if line.startswith("MIDCALL")}
    assert set(midcall) == {(what, how) for what in ("generate", "sync") for how in ("killed", "stalled")}, lines
    for (what, how), waited in midcall.items():       # a kill is noticed at once, a stall at the deadline
        assert (TIMEOUT <= waited < TIMEOUT + 30) if how == "stalled" else waited < TIMEOUT, (what, how, waited)
    stopped = next(line for line in lines if line.startswith("STOPPED"))     # twice in a row stops the run
    assert "failed again after a restart" in stopped and "newest checkpoint is intact" in stopped
