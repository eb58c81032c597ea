"""RLBatch: one batch dimension for tensors and non-tensor columns."""

from __future__ import annotations

import pytest
import torch

from nanoverl_core import RLBatch


def make(rows: int = 4) -> RLBatch:
    return RLBatch.from_dict({"x": torch.arange(rows * 2).view(rows, 2), "m": torch.ones(rows, 3)},
                             non_tensors={"uid": [f"u{i}" for i in range(rows)]})


def test_index_slice_and_mask_keep_rows_aligned():
    b = make()
    assert b[1:3]["x"].tolist() == [[2, 3], [4, 5]] and b[1:3]["uid"] == ["u1", "u2"]
    assert b[[3, 0]]["uid"] == ["u3", "u0"]
    assert b[torch.tensor([True, False, False, True])]["x"][:, 0].tolist() == [0, 6]
    assert len(b[2]) == 1


def test_repeat_interleave_groups_each_prompt():
    b = make(2).repeat_interleave(3)
    assert b["uid"] == ["u0"] * 3 + ["u1"] * 3
    assert b["x"][:, 0].tolist() == [0, 0, 0, 2, 2, 2]


def test_split_and_concat_round_trip():
    b = make(5)
    parts = b.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    back = RLBatch.concat(parts)
    assert torch.equal(back["x"], b["x"]) and back["uid"] == b["uid"]


def test_concat_rejects_different_columns_or_widths():
    with pytest.raises(ValueError, match="same columns"):
        RLBatch.concat([make(2), RLBatch({"x": make(2)["x"]})])
    other = RLBatch({"x": torch.zeros(2, 5, dtype=torch.long), "m": torch.ones(2, 3)}, {"uid": ["a", "b"]})
    with pytest.raises(ValueError, match="different shapes"):
        RLBatch.concat([make(2), other])


def test_mismatched_batch_size_fails_with_the_column_name():
    b = make(4)
    with pytest.raises(ValueError, match="'y' has 3 rows but the batch has 4"):
        b["y"] = torch.zeros(3)
    with pytest.raises(ValueError, match="'names' has 5 rows"):
        b["names"] = ["a"] * 5


def test_index_keeps_the_given_row_order():
    assert make(3).index([2, 0, 1])["uid"] == ["u2", "u0", "u1"]


def test_update_pop_and_to():
    b = make(2)
    s = RLBatch({"x": b["x"]}, {"uid": b["uid"]})
    assert sorted(s.keys()) == ["uid", "x"]
    s.update(RLBatch({"y": torch.ones(2)}))
    assert "y" in s and "y" not in b
    assert s.pop("y").tolist() == [1.0, 1.0] and "y" not in s
    assert b.to("cpu")["x"].device.type == "cpu"
    with pytest.raises(KeyError, match="no column 'zz'"):
        b["zz"]


def test_a_rollout_that_splits_rows_joins_them_to_their_input_rows():
    """rollout_rows: an agent rollout's rows name their input row (`episode_row`); training repeats the input row
    for each (uid, data row), evaluation keeps each input row's last; split_inputs keeps them in one chunk."""
    from nanoverl_core.rollout import rollout_rows

    out = RLBatch({"responses": torch.tensor([[1], [2], [3], [4], [5]]), "episode_row": torch.tensor([0, 1, 1, 1, 2])})
    trained = rollout_rows(make(3), out, split_rows=True)
    assert trained["uid"] == ["u0", "u1", "u1", "u1", "u2"] and trained["x"][:, 0].tolist() == [0, 2, 2, 2, 4]
    assert [part["responses"][:, 0].tolist() for part in trained.split_inputs(2)] == [[1, 2, 3, 4], [5]]
    assert [len(part) for part in trained.split_inputs(1)] == [1, 3, 1]
    kept = rollout_rows(make(3), out, split_rows=False)
    assert kept["uid"] == ["u0", "u1", "u2"] and kept["responses"][:, 0].tolist() == [1, 4, 5]
    plain = make(4)
    assert [p["uid"] for p in plain.split_inputs(3)] == [["u0", "u1", "u2"], ["u3"]]   # no episode_row: split(3)
