"""Tiny from-scratch models for CPU experiments and tests.

`build_tiny_model(out)` writes a model *folder without weights*: a Llama `config.json` and a
character-level tokenizer (one token per character of `alphabet`, plus <pad>, <bos>, <eos>). The `hf`
worker sees no weight files and draws random weights from `trainer.seed` at load time, so the folder
is a few KB and every seed is a different initialisation.

    python -m nanoverl_hf.tiny --out DIR [--alphabet 0123456789=] [--hidden 64 --layers 2 --heads 4]

The defaults (alphabet of digits and "=", hidden 64, 2 layers, 4 heads, tied embeddings) give a
14-token vocabulary and 83,136 parameters.
"""

from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHATML = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
"""A chat template of ChatML's shape: each message "<|role|>content<eos>", a newline; the generation prompt
"<|assistant|>"."""
PRINTABLE = string.printable.replace("\x0b", "").replace("\x0c", "")
"""Every printable character but the vertical tab and form feed: an alphabet for chat messages and JSON tool calls."""


def build_tokenizer(alphabet: str, chat_template: str | None = None):
    """A PreTrainedTokenizerFast splitting text into single characters of `alphabet`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *chars])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()                                              # and join them back without spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>")
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


def build_tiny_model(out: str | Path, alphabet: str = "0123456789=", hidden: int = 64, layers: int = 2,
                     heads: int = 4, intermediate: int | None = None, max_positions: int = 128,
                     chat_template: str | None = None) -> Path:
    """Write config.json + tokenizer files (no weights) to `out`; returns the folder."""
    from transformers import LlamaConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(alphabet, chat_template)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=hidden // heads, max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def num_parameters(folder: str | Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nanoverl_hf.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write config.json and tokenizer files to")
    parser.add_argument("--alphabet", default="0123456789=", help="characters of the vocabulary")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args(argv)
    folder = build_tiny_model(args.out, args.alphabet, args.hidden, args.layers, args.heads)
    config = json.loads((folder / "config.json").read_text())
    print(f"wrote {folder}: vocab {config['vocab_size']}, {num_parameters(folder):,} parameters (random at load time)")


if __name__ == "__main__":
    main()
