"""verl interop: rows in verl's GSM8K parquet layout load without any key settings, and a reward written as
verl's `compute_score(data_source, solution_str, ground_truth, extra_info)` runs unchanged from
reward.file, scoring those rows exactly as the built-in `gsm8k` reward does (in the scorer, and in two
real CLI runs with the same seed: one with reward.name=gsm8k, one with the verl file).
"""

from __future__ import annotations

import json
import string

import pytest
import torch

from conftest import GSM8K, ROOT, read_metrics, run_cli
from nanoverl_core.testing import score_texts

pytestmark = pytest.mark.hf

# verl's custom_reward_function contract (verl.utils.reward_score.default_compute_score's signature):
# called with keywords; ground_truth is reward_model.ground_truth, extra_info the row's extra_info.
VERL_REWARD = '''
from nanoverl_hf.rewards import extract_answer, normalize_number


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source != "openai/gsm8k" or extra_info.get("split") != "test" or "index" not in extra_info:
        raise ValueError(f"not a verl GSM8K row: {data_source!r}, {extra_info!r}")
    answer, _ = extract_answer(solution_str)
    return float(answer is not None and answer == normalize_number(ground_truth))
'''


CHAT = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}"


@pytest.fixture(scope="module")
def verl_rows(tmp_path_factory):
    """The first ten shipped GSM8K test rows (verl's examples/data_preprocess/gsm8k.py layout, column for
    column) whose prompt is plain ASCII, as a parquet file written with the shipped schema."""
    import pyarrow.parquet as pq

    table = pq.read_table(GSM8K / "test.parquet")
    rows = table.slice(0, 60).to_pylist()
    keep = [i for i, r in enumerate(rows) if set(r["prompt"][0]["content"]) <= set(string.printable)
            and len(r["prompt"][0]["content"]) < 400][:8]
    path = tmp_path_factory.mktemp("verl") / "gsm8k.parquet"
    pq.write_table(table.take(keep), str(path))
    return path


def responses_for(truth: str) -> list[str]:
    n = int(truth)
    return [f"Step by step... #### {truth}", f"#### {n + 1}", f"so the answer is \\boxed{{{truth}}}", f"I get {truth}.",
            f"#### {n:,}", f"#### ${truth}.00", "no idea", f"{truth} apples, no wait, {n + 2}", ""]


def test_a_verl_compute_score_scores_verl_rows_like_the_builtin_gsm8k(tmp_path, verl_rows):
    from nanoverl_core.batch import RLBatch
    from nanoverl_core.config import DataConfig, RewardConfig
    from nanoverl_core.data import collate, load_prompts
    from nanoverl_core.plugins import load_registry
    from nanoverl_core.reward import RewardScorer
    from nanoverl_hf.tiny import build_tokenizer

    data = load_prompts([str(verl_rows)], DataConfig(max_prompt_length=2048), build_tokenizer(string.printable, CHAT))
    assert len(data) == 8 and data.texts[0].endswith('output the final answer after "####".\nA: ')
    rows = collate(data, list(range(8)), 0, DataConfig().data_source_key)
    assert rows["data_source"] == ["openai/gsm8k"] * 8
    texts, index = [], []
    for i in range(8):
        for response in responses_for(data.rows[i]["reward_model"]["ground_truth"]):
            texts.append(response)
            index.append(i)
    batch = RLBatch({"x": torch.zeros(len(texts))}, {key: [rows[key][i] for i in index] for key in ("prompt_text", "row", "index", "data_source")})
    verl_file = tmp_path / "verl_gsm8k.py"
    verl_file.write_text(VERL_REWARD)
    registry = load_registry()
    builtin = RewardScorer(RewardConfig(name="gsm8k", workers=0), registry)
    verl = RewardScorer(RewardConfig(file=str(verl_file), workers=2), registry)
    expected, metrics = score_texts(builtin, batch, texts)
    got, verl_metrics = score_texts(verl, batch, texts)
    verl.close()
    assert got.tolist() == expected.tolist()
    assert 0 < sum(expected.tolist()) < len(texts)  # both outcomes occur
    assert verl_metrics["reward/errors"] == metrics["reward/errors"] == 0


@pytest.fixture(scope="module")
def ascii_model(tmp_path_factory):
    from nanoverl_hf.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("ascii") / "model", alphabet=string.printable, hidden=32,
                            layers=1, heads=2, max_positions=1024, chat_template=CHAT)


def test_the_cli_trains_on_verl_rows_with_a_verl_reward_file_exactly_as_with_gsm8k(tmp_path, verl_rows, ascii_model):
    verl_file = tmp_path / "verl_gsm8k.py"
    verl_file.write_text(VERL_REWARD)
    common = ["--config", str(ROOT / "examples/configs/tiny_grpo.toml"), f"model.path={ascii_model}",
              f"data.train_files=[{verl_rows}]", "data.val_files=[]", "data.max_prompt_length=1024",
              "data.batch_size=4", "rollout.n=2", "rollout.max_new_tokens=8", "trainer.total_steps=2",
              "trainer.save_every=0", "trainer.progress=none", "trainer.rollout_samples=-1",
              "tracking.trackers=[jsonl]", "algorithm.advantage_estimator=reinforce_plus_plus", "reward.workers=2"]
    runs = {}
    for name, reward in (("builtin", "reward.name=gsm8k"), ("verl", f"reward.file={verl_file}")):
        run_dir = tmp_path / name
        proc = run_cli(*common, reward, f"trainer.output_dir={run_dir}", timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rollouts = [[json.loads(line) for line in (run_dir / "rollouts" / f"step_{s}.jsonl").read_text().splitlines()]
                    for s in (1, 2)]
        runs[name] = (rollouts, read_metrics(run_dir))
    (b_rollouts, b_metrics), (v_rollouts, v_metrics) = runs["builtin"], runs["verl"]
    assert [[(r["response"], r["score"]) for r in step] for step in v_rollouts] == \
        [[(r["response"], r["score"]) for r in step] for step in b_rollouts]
    assert [m["reward/mean"] for m in v_metrics] == [m["reward/mean"] for m in b_metrics]
    assert all(m["reward/errors"] == 0 for m in v_metrics)
