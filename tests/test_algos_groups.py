"""Pinned behaviour of uniform-group detection and filtering (DAPO-style dynamic sampling)."""

import torch

from nanoverl_core.algos import filter_uniform_groups, uniform_groups
from nanoverl_core.batch import RLBatch


def test_uniform_groups_with_shuffled_string_uids():
    # group "b": 1, 1 (uniform) | group "a": 0, 1, 0 (mixed) | group "c": one row (uniform by definition)
    uids = ["b", "a", "c", "a", "b", "a"]
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    assert uniform_groups(scores, uids).tolist() == [True, False, True, False, True, False]


def test_uniform_groups_compares_exactly_and_accepts_any_hashable_uid():
    uids = [(1, "x"), (1, "x"), 7, 7]
    scores = torch.tensor([0.5, 0.5 + 1e-6, -2.0, -2.0])
    assert uniform_groups(scores, uids).tolist() == [False, False, True, True]


def test_filter_uniform_groups_keeps_row_order_and_counts_dropped_groups():
    uids = ["b", "a", "c", "a", "b", "a"]
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    batch = RLBatch.from_dict({"response_mask": torch.arange(6).unsqueeze(1).repeat(1, 2)},
                              non_tensors={"uid": uids})
    kept, dropped = filter_uniform_groups(batch, scores)
    assert dropped == 2  # "b" and "c"
    assert kept["uid"] == ["a", "a", "a"]
    assert kept["response_mask"][:, 0].tolist() == [1, 3, 5]


def test_filter_uniform_groups_can_drop_everything():
    batch = RLBatch.from_dict({"response_mask": torch.ones(3, 2)}, non_tensors={"uid": ["x", "x", "y"]})
    kept, dropped = filter_uniform_groups(batch, torch.tensor([1.0, 1.0, 0.0]))
    assert dropped == 2 and len(kept) == 0 and kept["response_mask"].shape == (0, 2)
