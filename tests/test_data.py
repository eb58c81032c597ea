"""Data loading through `datasets`, chat prompts, length filtering, and the stateful sampler."""

from __future__ import annotations

import json

import pytest

from conftest import GSM8K
from nanoverl_core.config import DataConfig
from nanoverl_core.data import StatefulSampler, collate, load_prompts
from nanoverl_core.errors import DataError


class WordTokenizer:
    """Whitespace tokens, with a chat template that tags roles (enough to test the data path)."""

    pad_token_id, eos_token_id = 0, 1
    chat_template = "role-tags"

    def encode(self, text, add_special_tokens=True):
        return [2 + (hash(w) % 1000) for w in text.split()]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + (" <assistant>" if add_generation_prompt else "")


@pytest.mark.skipif(not GSM8K.exists(), reason="shared GSM8K data not present")
def test_gsm8k_parquet_loads_as_it_is_through_the_chat_template():
    cfg = DataConfig(max_prompt_length=4096)
    ds = load_prompts([str(GSM8K / "test.parquet")], cfg, WordTokenizer())
    assert len(ds) == 1319 and ds.num_filtered == 0
    assert ds.texts[0].startswith("<user> ") and ds.texts[0].endswith("<assistant>")
    assert ds.rows[0]["reward_model"]["ground_truth"].strip() != ""
    batch = collate(ds, [0, 1, 2], WordTokenizer.pad_token_id, cfg.data_source_key)
    assert batch["data_source"] == ["openai/gsm8k"] * 3


def test_overlong_prompts_are_filtered_and_counted(tmp_path, capsys):
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"prompt": " ".join(["w"] * n)}) + "\n" for n in (2, 5, 9, 3)))
    ds = load_prompts([str(f)], DataConfig(max_prompt_length=4), WordTokenizer())
    assert len(ds) == 2 and ds.num_filtered == 2
    assert "dropped 2 of 4 prompts" in capsys.readouterr().err


def test_left_padding_and_mask():
    f_rows = {"rows": [{"prompt": "a b c"}, {"prompt": "d"}]}
    from nanoverl_core.data import PromptDataset
    ds = PromptDataset(f_rows["rows"], [[5, 6, 7], [8]], ["a b c", "d"])
    b = collate(ds, [0, 1], 0, "data_source")
    assert b["prompts"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert b["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b["data_source"] == ["default", "default"]


def test_empty_file_and_bad_rows_are_data_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.jsonl"):
        load_prompts([str(empty)], DataConfig(), WordTokenizer())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    with pytest.raises(DataError, match="bad.jsonl row 1"):
        load_prompts([str(bad)], DataConfig(), WordTokenizer())


def test_chat_prompts_need_a_chat_template_unless_switched_off(tmp_path):
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"prompt": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "What is 3 + 4?"}]}) + "\n")

    class NoTemplate(WordTokenizer):
        chat_template = None

    with pytest.raises(DataError, match=r"chat.jsonl row 0: 'prompt' is a chat .* no chat template.*"
                                        r"data.apply_chat_template = false"):
        load_prompts([str(chat)], DataConfig(), NoTemplate())
    joined = load_prompts([str(chat)], DataConfig(apply_chat_template=False), NoTemplate())
    assert joined.texts == ["be brief\nWhat is 3 + 4?"]
    templated = load_prompts([str(chat)], DataConfig(), WordTokenizer())
    assert templated.texts == ["<system> be brief <user> What is 3 + 4? <assistant>"]


def test_sampler_covers_each_epoch_and_resumes_exactly():
    s = StatefulSampler(10, 3, seed=7)
    first_epoch = [s.next_indices() for _ in range(3)]
    assert len(set(sum(first_epoch, []))) == 9  # no repeats inside an epoch; the tail of 1 is skipped
    state = s.state_dict()
    expected = [s.next_indices() for _ in range(4)]
    resumed = StatefulSampler(10, 3, seed=7)
    resumed.load_state_dict(state)
    assert [resumed.next_indices() for _ in range(4)] == expected
    assert s.epoch == 2  # epochs advance and reshuffle


def test_sampler_needs_a_full_batch():
    with pytest.raises(DataError, match="data.batch_size = 8"):
        StatefulSampler(5, 8, seed=0)
