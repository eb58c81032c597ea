"""Agents under torchrun: each rank runs the agents of its share of the rows against its own endpoint, and an
episode that splits into two rows comes back, on every rank, as two rows of its own input row, in order."""

from __future__ import annotations

import pytest

from conftest import EXAMPLE, read_metrics, run, torchrun

pytest.importorskip("fastapi")
pytest.importorskip("openai")

AGENT = """
def agent(row, client):
    client.completions.create(model="m", prompt=row["prompt"], max_tokens=2)
    if int(row["target"]) % 2 == 0:          # half the episodes go on from another prompt: a second row
        client.completions.create(model="m", prompt="0" + row["prompt"], max_tokens=2)
"""
# 1 where the row the trainer pairs with a response is the one its agent answered (the prompt the model read
# holds the data row's prompt), 0 otherwise: a misaligned gather of split rows scores below 1.
ALIGNED = """
def aligned(prompt, response, sample):
    return float(prompt.endswith(sample["prompt"]))
"""


def test_agents_under_torchrun_split_their_episodes_into_rows_of_their_own_input_row(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "aligned.py").write_text(ALIGNED)
    run(torchrun(2, "-m", "nanoverl_core.cli", "--config", str(EXAMPLE), "trainer.total_steps=2",
                 "trainer.save_every=0", "trainer.val_every=2", "data.batch_size=4", "rollout.n=2",
                 "actor.micro_batch_size=4", "trainer.progress=none", "tracking.trackers=[jsonl]",
                 f"agent.file={tmp_path / 'agent.py'}", "agent.function=agent", "agent.workers=1",
                 f"reward.file={tmp_path / 'aligned.py'}", "reward.function=aligned", "reward.workers=0",
                 f"trainer.output_dir={tmp_path / 'run'}"), timeout=300)
    metrics = read_metrics(tmp_path / "run")
    assert all(m["reward/mean"] == 1.0 and m["episode/errors"] == 0.0 for m in metrics.values())
    assert any(0.0 < m["episode/splits/mean"] < 1.0 for m in metrics.values())
    assert metrics[2]["val/reward/mean"] == 1.0
