"""Tiny from-scratch model folders and the shipped tiny-task example."""

from __future__ import annotations

import json
from pathlib import Path

from nanoverl_hf.tiny import build_tiny_model, main, num_parameters

REPO = Path(__file__).resolve().parents[3]


def test_tiny_folder_has_config_and_char_tokenizer_but_no_weights(tmp_path):
    from transformers import AutoTokenizer
    folder = build_tiny_model(tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["hidden_size"], config["num_hidden_layers"],
            config["num_attention_heads"]) == ("llama", 14, 64, 2, 4)
    assert num_parameters(folder) == 83_136
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.encode("4831=") == [7, 11, 6, 4, 13]                                  # one token per character
    assert tok.decode([7, 11, 6, 4, 2, 0], skip_special_tokens=True) == "4831"      # no spaces, no specials
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_the_command_line_builds_a_folder(tmp_path, capsys):
    main(["--out", str(tmp_path / "m"), "--alphabet", "ab", "--hidden", "32", "--heads", "2"])
    assert "vocab 5" in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "config.json").read_text())["head_dim"] == 16


def test_the_shipped_tiny_task_is_consistent():
    model = REPO / "examples/tiny_task/model"
    assert json.loads((model / "config.json").read_text())["vocab_size"] == 14
    assert not list(model.glob("*.safetensors"))
    rows = [json.loads(line) for line in (REPO / "examples/data/tiny_copy/val.jsonl").read_text().splitlines()]
    train = {json.loads(line)["target"] for line in (REPO / "examples/data/tiny_copy/train.jsonl").read_text().splitlines()}
    assert len(rows) == 64 and len(train) == 2048 and not train & {r["target"] for r in rows}
    assert all(r["prompt"] == r["target"] + "=" and len(r["target"]) == 4 for r in rows)
