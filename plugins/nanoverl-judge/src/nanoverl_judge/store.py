"""The judge's files in the run directory: the request cache and the request/reply log.

    <run_dir>/judge/cache.sqlite    key (sha256 of the request) -> the request and its HTTP-200 reply body;
                                    each insert is committed at once, so a SIGKILL loses at most the reply
                                    being written (sqlite's journal keeps the file whole)
    <run_dir>/judge/requests.jsonl  one line per request: phase, step, the rows' indices and uids, the cache
                                    key, the exact request and reply, the scores, the failure kind, cached or
                                    not, attempts, seconds

Neither file holds the API key: it travels in a request header only (client.headers).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


class Cache:
    """Replies by request key, in a sqlite file (or nowhere: path None)."""

    def __init__(self, path: Path | None):
        self.db = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None)  # autocommit
            self.db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, request TEXT, body TEXT)")

    def get(self, key: str) -> str | None:
        if self.db is None:
            return None
        row = self.db.execute("SELECT body FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, request: dict, body: str) -> None:
        if self.db is not None:
            self.db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?)",
                            (key, json.dumps(request, sort_keys=True), body))

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


def append_log(path: Path | None, records: list[dict]) -> None:
    """Append records to the request log (nothing when path is None)."""
    if path is None or not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(json.dumps(record, default=str) + "\n" for record in records)
