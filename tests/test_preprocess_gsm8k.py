"""scripts/preprocess_gsm8k.py rebuilds the shipped GSM8K rows (examples/data/gsm8k) exactly, offline.

The raw examples (question, worked answer) are taken back out of the shipped rows' extra_info, so no
hub is needed: make_row must turn them into the very rows that were shipped.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "gsm8k"
_spec = importlib.util.spec_from_file_location("preprocess_gsm8k", ROOT / "scripts" / "preprocess_gsm8k.py")
preprocess = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preprocess)


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[dict]]:
    return {split: pq.read_table(DATA / f"{split}.parquet").to_pylist() for split in preprocess.SPLITS}


def rebuild(row: dict) -> dict:
    raw = row["extra_info"]
    return preprocess.make_row(raw["question"], raw["answer"], raw["split"], raw["index"])


def test_the_shipped_files_are_the_whole_dataset_with_its_license(shipped):
    assert {s: len(r) for s, r in shipped.items()} == {"train": 7473, "test": 1319}
    assert (DATA / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) 2021 OpenAI")


def test_make_row_rebuilds_hand_picked_rows_exactly(shipped):
    natalia = shipped["train"][0]
    assert rebuild(natalia) == natalia
    assert natalia["prompt"][0]["content"] == (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
        "clips did Natalia sell altogether in April and May? Let's think step by step and output the final answer "
        'after "####".')
    assert natalia["reward_model"] == {"style": "rule", "ground_truth": "72"}
    with_comma = next(r for r in shipped["test"] if "," in r["extra_info"]["answer"].rsplit("####", 1)[1])
    assert rebuild(with_comma) == with_comma and "," not in with_comma["reward_model"]["ground_truth"]
    negative = next(r for r in shipped["test"] if r["reward_model"]["ground_truth"].startswith("-"))
    assert rebuild(negative) == negative


def test_make_row_rebuilds_every_shipped_row(shipped):
    for split, rows in shipped.items():
        for i, row in enumerate(rows):
            assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == i
            assert rebuild(row) == row, (split, i)


def test_the_written_parquet_has_the_shipped_schema(shipped, tmp_path):
    rows = [rebuild(row) for row in shipped["test"][:2]]
    out = tmp_path / "test.parquet"
    preprocess.write_parquet(rows, out)
    assert pq.read_schema(out).equals(pq.read_schema(DATA / "test.parquet"))  # column and struct field order
    assert pq.read_table(out).to_pylist() == shipped["test"][:2]


def test_extract_solution_is_verls_rule():
    assert preprocess.extract_solution("3 + 4 = <<3+4=7>>7\n#### 1,600") == "1600"
    assert preprocess.extract_solution("#### -12") == "-12"
    with pytest.raises(ValueError, match="####"):
        preprocess.extract_solution("no marker")


def test_main_writes_and_checks_both_splits(shipped, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(preprocess, "build", lambda split: [rebuild(row) for row in shipped[split]])  # no hub
    assert preprocess.main(["--out", str(tmp_path)]) == 0
    for split in preprocess.SPLITS:
        assert pq.read_table(tmp_path / f"{split}.parquet").to_pylist() == shipped[split]
    assert preprocess.main(["--check"]) == 0  # against the shipped files
    assert capsys.readouterr().out.count("identical") == 2
    monkeypatch.setattr(preprocess, "build", lambda split: [rebuild(row) for row in shipped[split][:-1]])
    assert preprocess.main(["--check", "--out", str(tmp_path)]) == 1
