"""Prompt datasets, the data sources they come from, and the stateful loader.

Rows come from the data source `data.source` names (`register_data_sources`): the built-in "files"
reads `data.train_files` / `data.val_files` with `datasets` (jsonl / json / parquet); a generator
draws them from its settings. Prompts are tokenized once per load; chat-format prompts (a list of
{"role", "content"} messages) go through the tokenizer's chat template when it has one. Prompts longer
than `data.max_prompt_length` are dropped and counted. The sampler's state (epoch, position) goes into
every checkpoint; a source gives the same rows for the same (split, epoch), so a resumed run reloads
its epoch and continues at exactly the next prompt.
"""

from __future__ import annotations

import copy
import errno
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from .batch import RLBatch
from .config import DataConfig
from .errors import DataError, one_line

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


@attrs.define
class PromptDataset:
    rows: list[dict[str, Any]]
    """The dataset rows as read (handed to reward functions as `sample`)."""
    prompt_ids: list[list[int]]
    texts: list[str]
    """The prompt as the model sees it (after the chat template)."""
    num_filtered: int = 0
    """Prompts dropped for being longer than data.max_prompt_length."""

    def __len__(self) -> int:
        return len(self.rows)


def read_rows(files: list[str], key: str) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    rows: list[dict[str, Any]] = []
    for name in files:
        path = Path(name)
        try:
            path.stat()
        except OSError as exc:  # missing, or a name the OS refuses (too long)
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise DataError(f"{key}: data file {name[:80]!r}... cannot be opened ({exc.strerror}); fix the "
                                "path") from None
        if not path.is_file():
            if path.is_dir():
                raise DataError(f"{key}: {name} is a folder, not a data file; name the jsonl / json / parquet "
                                "files in it")
            raise DataError(f"{key}: data file {name} does not exist; check the path")
        fmt = _FORMATS.get(path.suffix)
        if fmt is None:
            raise DataError(f"{key}: data file {name} must end in .jsonl, .json or .parquet")
        if path.stat().st_size == 0:  # `datasets` reports an empty file as a bare StopIteration
            raise DataError(f"{key}: data file {name} has no rows")
        check_file_format(path, key)
        try:
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
            if len(ds) == 0:
                raise DataError(f"{key}: data file {name} has no rows")
            rows.extend({"__file__": name, "__row__": i, **row} for i, row in enumerate(ds))
        except DataError:
            raise
        except Exception as exc:  # datasets raises many types for malformed files
            detail = " ".join(str(exc).split())[:300]
            raise DataError(f"{key}: data file {name} cannot be read ({type(exc).__name__}: {detail}); "
                            "fix or regenerate the file") from None
    return rows


def check_file_format(path: Path, key: str) -> None:
    """The file is what its suffix says, before `datasets` reads it: a .parquet file starts and ends with
    parquet's magic bytes; a .jsonl / .json file is UTF-8 text, without NUL bytes, and (.jsonl) a JSON
    object on every non-blank line. The error names the file, the line and what was expected."""
    if path.suffix == ".parquet":
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(path.stat().st_size - 4, 0))
            tail = f.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            raise DataError(f"{key}: data file {path} is not a parquet file (it does not start and end with "
                            "parquet's PAR1 bytes); name it for what it holds (.jsonl, .json) or regenerate it")
        return
    data = path.read_bytes()
    for number, line in enumerate(data.split(b"\n"), start=1):
        where = f"{key}: data file {path} cannot be read: line {number}"
        if b"\0" in line:
            column = line.index(b"\0") + 1
            raise DataError(f"{where} holds a NUL byte (column {column}); a {path.suffix} file is "
                            "UTF-8 text: remove it (a NUL inside a string is written \\u0000)")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where} is not UTF-8 (byte {line[exc.start]:#04x} at column {exc.start + 1}); "
                            "convert the file to UTF-8 (iconv -f latin1 -t utf-8, say)") from None
        if path.suffix == ".jsonl" and text.strip():
            try:
                row = json.loads(text)
            except ValueError as exc:
                raise DataError(f"{where} is not JSON ({' '.join(str(exc).split())[:120]}); each line of a .jsonl "
                                "file holds one JSON object") from None
            if not isinstance(row, dict):
                raise DataError(f"{where} holds a {type(row).__name__}, not a JSON object (a row of named "
                                "columns)") from None


def render_prompt(row: dict[str, Any], cfg: DataConfig, tokenizer, tools: list | None = None) -> str:
    """The prompt text of `row`; with `tools` (a multi-turn environment's), rendered with the tools'
    schemas (nanoverl_core.env.tools: the template's own tool format, or the tag-format instructions)."""
    prompt = row.get(cfg.prompt_key)
    where = f"{row['__file__']} row {row['__row__']}"
    if isinstance(prompt, str):
        if tools:
            from .env.tools import tool_prompt
            return f"{tool_prompt(tools)}\n\n{prompt}"
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt):
        if not cfg.apply_chat_template:
            return "\n".join(str(m["content"]) for m in prompt)
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(f"{where}: {cfg.prompt_key!r} is a chat (a list of messages) but the tokenizer has no "
                            "chat template; use a model whose tokenizer has one, or set data.apply_chat_template "
                            "= false to join the messages' contents with newlines")
        try:
            if tools:
                from .env.tools import with_tools
                return with_tools(prompt, tokenizer, tools)
            return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        except DataError:
            raise
        except Exception as exc:  # the template's own raise_exception (jinja's TemplateError), or a bad message
            detail = one_line(exc, 200)
            raise DataError(f"{where}: the tokenizer's chat template refuses the messages of {cfg.prompt_key!r} "
                            f"({detail}); fix the row's messages (roles, their order), use a model.tokenizer_path "
                            "whose template takes them, or set data.apply_chat_template = false") from None
    if prompt is None:
        raise DataError(f"{where} has no {cfg.prompt_key!r} column; set data.prompt_key to the prompt column "
                        f"(this row has {', '.join(k for k in row if not k.startswith('__'))})")
    raise DataError(f"{where}: {cfg.prompt_key!r} must be a string or a list of chat messages "
                    f"with 'content', got {type(prompt).__name__}")


class FileSource:
    """The built-in data source "files": data.train_files and data.val_files, the same rows every epoch."""

    generated = False

    def __init__(self, config) -> None:
        self.files = {"train": config.data.train_files, "val": config.data.val_files}

    def rows(self, split: str, epoch: int) -> list[dict[str, Any]]:
        files = self.files[split]
        return read_rows(files, f"data.{split}_files") if files else []


def load_prompts(files: list[str], cfg: DataConfig, tokenizer, key: str = "data.train_files",
                 tools: list | None = None) -> PromptDataset:
    return prompts_from_rows(read_rows(files, key), cfg, tokenizer, key, tools)


def split_key(cfg: DataConfig, split: str) -> str:
    """How messages name a split's rows: the files' key, or the source's settings table."""
    return f"data.{split}_files" if cfg.source == "files" else f"[data.{cfg.source}] ({split} rows)"


def load_split(source, split: str, cfg: DataConfig, tokenizer, *, epoch: int = 0, tools: list | None = None,
               exclude: frozenset[str] = frozenset()) -> PromptDataset | None:
    """The prompts of `source.rows(split, epoch)` (None when it has none; "val": its first
    data.val_max_samples rows when set), without those whose rendered prompt is in `exclude` (the
    validation prompts, for a generated source's training rows)."""
    key = split_key(cfg, split)
    rows = [row if "__file__" in row else {"__file__": f"data.source {cfg.source!r} {split} epoch {epoch}",
                                           "__row__": i, **row}
            for i, row in enumerate(source.rows(split, epoch))]
    if split == "val" and cfg.val_max_samples:
        rows = rows[:cfg.val_max_samples]
    return prompts_from_rows(rows, cfg, tokenizer, key, tools, exclude) if rows else None


def prompts_from_rows(rows: list[dict[str, Any]], cfg: DataConfig, tokenizer, key: str, tools: list | None = None,
                      exclude: frozenset[str] = frozenset()) -> PromptDataset:
    kept_rows, ids, texts, seen = [], [], [], 0
    for row in rows:
        text = render_prompt(row, cfg, tokenizer, tools)
        if text in exclude:
            seen += 1
            continue
        try:
            tokens = tokenizer.encode(text, add_special_tokens=False) if getattr(tokenizer, "chat_template", None) \
                else tokenizer.encode(text)
        except DataError as exc:  # a tokenizer that rejects the text: say which file and row
            raise DataError(f"{row['__file__']} row {row['__row__']}: {exc}") from None
        except Exception as exc:  # a Hugging Face tokenizer raises what its backend raises (a bare Exception)
            raise DataError(f"{row['__file__']} row {row['__row__']}: the tokenizer of model.path cannot encode the "
                            f"prompt {text[:80]!r} ({' '.join(str(exc).split())}); fix the row or use a tokenizer "
                            "that covers its characters") from None
        if not tokens:
            raise DataError(f"{row['__file__']} row {row['__row__']}: the prompt is empty")
        if len(tokens) <= cfg.max_prompt_length:
            kept_rows.append({k: v for k, v in row.items() if not k.startswith("__")})
            ids.append(tokens)
            texts.append(text)
    if seen:
        print(f"warning: {key}: dropped {seen} of {len(rows)} prompts that are validation prompts", file=sys.stderr)
    dropped = len(rows) - seen - len(kept_rows)
    if dropped:
        print(f"warning: {key}: dropped {dropped} of {len(rows)} prompts longer than "
              f"data.max_prompt_length={cfg.max_prompt_length} tokens", file=sys.stderr)
    if not kept_rows and seen:
        raise DataError(f"{key}: every prompt is a validation prompt; draw training and validation rows from "
                        "different settings or seeds")
    if not kept_rows:
        raise DataError(f"{key}: every prompt is longer than data.max_prompt_length={cfg.max_prompt_length}; "
                        "raise it or shorten the prompts")
    return PromptDataset(kept_rows, ids, texts, dropped)


def collate(ds: PromptDataset, indices: list[int], pad_token_id: int, data_source_key: str) -> RLBatch:
    """Left-padded prompts (B, P) and their mask, plus the rows as non-tensor columns."""
    width = max(len(ds.prompt_ids[i]) for i in indices)
    prompts = torch.full((len(indices), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(indices), width), dtype=torch.long)
    for r, i in enumerate(indices):
        tokens = ds.prompt_ids[i]
        prompts[r, width - len(tokens):] = torch.tensor(tokens)
        mask[r, width - len(tokens):] = 1
    rows = [ds.rows[i] for i in indices]
    return RLBatch({"prompts": prompts, "prompt_mask": mask},
                   {"prompt_text": [ds.texts[i] for i in indices], "row": rows, "index": list(indices),
                    "data_source": [str(row.get(data_source_key, "default")) for row in rows]})


class StatefulSampler:
    """Batches of dataset indices, reshuffled every epoch from (seed, epoch); its state is two ints.

    An epoch's tail that cannot fill a batch is skipped, so every batch has `batch_size` prompts.
    `epoch_size(epoch)`, if given, is the number of rows of each epoch (a generated source's epochs
    may differ by the prompts dropped); else every epoch has `size`.
    """

    def __init__(self, size: int, batch_size: int, seed: int, shuffle: bool = True,
                 epoch_size: Callable[[int], int] | None = None):
        self.batch_size, self.seed, self.shuffle, self.epoch_size = batch_size, seed, shuffle, epoch_size
        self.epoch, self.position = 0, 0
        self._set_size(size)

    def _set_size(self, size: int) -> None:
        if size < self.batch_size:
            raise DataError(f"data.batch_size = {self.batch_size} but the training data has only {size} prompts"
                            f"{f' in epoch {self.epoch}' if self.epoch else ''}; lower data.batch_size or add data")
        self.size = size

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        gen = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        return torch.randperm(self.size, generator=gen).tolist()

    def next_indices(self) -> list[int]:
        if self.position + self.batch_size > self.size:
            self.epoch, self.position = self.epoch + 1, 0
            if self.epoch_size is not None:
                self._set_size(self.epoch_size(self.epoch))
        indices = self._order()[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return indices

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        if self.epoch_size is not None:
            self._set_size(self.epoch_size(self.epoch))


class _Prefetch(threading.Thread):
    """One epoch's load in a daemon thread: `result()` waits for it and raises what the load raised. A
    daemon, so that an epoch the run never reaches does not hold up the process's exit."""

    def __init__(self, epoch: int, load: Callable[[], PromptDataset]):
        super().__init__(name=f"nanoverl-prefetch-epoch-{epoch}", daemon=True)
        self.epoch, self._load = epoch, load
        self._value: PromptDataset | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._load()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of result()
            self._error = exc

    def result(self) -> PromptDataset:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


class PromptLoader:
    """The training prompts, epoch by epoch, and the stateful sampler over them.

    A generated source (`DataSource.generated`) gives each epoch its own rows: the loader loads epoch e's
    (`rows("train", e)`) when the sampler enters it, without the validation prompts (`exclude`). Any
    other source's rows are loaded once and reshuffled every epoch. The sampler's state is all a
    checkpoint needs: `sampler.load_state_dict` reloads the epoch it names.

    While a generated source's epoch e trains, one background thread loads epoch e + 1 (as a
    DataLoader's worker prefetches), with its own copy of the tokenizer, so that generating and
    tokenizing fresh rows (the tokenizer's Rust code runs without the GIL) overlaps the steps instead of
    stalling the first step of each epoch. The rows are the same either way: an epoch's rows are a pure
    function of (source settings, epoch), and a load's error surfaces when its epoch is reached.
    """

    def __init__(self, source, cfg: DataConfig, tokenizer, seed: int, *, tools: list | None = None,
                 exclude: frozenset[str] = frozenset()):
        self.source, self.cfg, self.tokenizer, self.tools = source, cfg, tokenizer, tools
        self.generated = bool(getattr(source, "generated", False))
        self.exclude = exclude if self.generated else frozenset()
        self._prefetch_tokenizer = copy.deepcopy(tokenizer) if self.generated else None
        self._next: _Prefetch | None = None
        self.epoch, self.data = 0, self._load(0, tokenizer)
        self._prefetch(1)
        self.steps_per_epoch = len(self.data) // cfg.batch_size
        """Full batches in epoch 0 (what trainer.total_epochs counts by)."""
        self.sampler = StatefulSampler(len(self.data), cfg.batch_size, seed, cfg.shuffle,
                                       epoch_size=lambda epoch: len(self.dataset(epoch)))

    def _load(self, epoch: int, tokenizer) -> PromptDataset:
        data = load_split(self.source, "train", self.cfg, tokenizer, epoch=epoch, tools=self.tools,
                          exclude=self.exclude)
        if data is None:
            raise DataError(f"{split_key(self.cfg, 'train')}: the data source {self.cfg.source!r} gave no training "
                            f"rows{f' for epoch {epoch}' if epoch else ''}; check its settings")
        return data

    def _prefetch(self, epoch: int) -> None:
        if self.generated:
            self._next = _Prefetch(epoch, lambda: self._load(epoch, self._prefetch_tokenizer))

    def dataset(self, epoch: int) -> PromptDataset:
        """The prompts of `epoch` (a generated source's are loaded when first asked for)."""
        if self.generated and epoch != self.epoch:
            ready = self._next if self._next is not None and self._next.epoch == epoch else None
            self.epoch, self.data = epoch, ready.result() if ready is not None else self._load(epoch, self.tokenizer)
            self._prefetch(epoch + 1)
        return self.data

    def next_batch(self, pad_token_id: int) -> RLBatch:
        indices = self.sampler.next_indices()
        return collate(self.dataset(self.sampler.epoch), indices, pad_token_id, self.cfg.data_source_key)
