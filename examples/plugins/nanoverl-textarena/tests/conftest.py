"""Run from a checkout without installing: the plugin's src on the path (test_train.py needs it installed)."""

import os
import sys
from importlib.util import find_spec
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if find_spec("nanoverl_textarena") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
