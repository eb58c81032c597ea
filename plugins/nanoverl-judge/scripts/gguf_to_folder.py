"""A .gguf model (de-quantized to float32 by transformers' GGUF reader) saved as a plain Hugging Face folder,
for `[reward.judge] serve` (needs the gguf package):

    python plugins/nanoverl-judge/scripts/gguf_to_folder.py models/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m-instruct
"""

import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    gguf, out = Path(sys.argv[1]), sys.argv[2]
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # the loaded model is marked GGUF-quantized and refuses save_pretrained: copy its weights into a plain one
    plain = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, gguf_file=name), dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.tie_weights()
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in plain.parameters()):,} parameters")


if __name__ == "__main__":
    main()
