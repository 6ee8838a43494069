"""models.embeddings.store: keys, entries that are refused or incomplete, put and load, resume from the shards on
disk, and concurrent encodes of one entry."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from models.embeddings.shard_log import SHARD_LOG, ShardLog
from models.embeddings.store import EmbeddingStore, shards_of, store_key
from models.errors import ContractMismatch


def test_keys_differ_by_each_part_and_fp32_keeps_its_old_key() -> None:
    base = store_key("f" * 64, 256, "corpus")
    assert base == store_key("f" * 64, 256, "corpus", "fp32") and len(base) == 32
    assert len({base, store_key("e" * 64, 256, "corpus"), store_key("f" * 64, 512, "corpus"),
                store_key("f" * 64, 256, "other"), store_key("f" * 64, 256, "corpus", "fp16")}) == 5


def test_shards_cover_the_rows_once() -> None:
    assert [(s.index, s.start, s.end) for s in shards_of(5, 2)] == [(0, 0, 2), (1, 2, 4), (2, 4, 5)]
    assert shards_of(0, 2) == []


def test_put_then_load_and_incomplete_entries(tmp_path: Path) -> None:
    store = EmbeddingStore(tmp_path, shard_size=2)
    vectors = np.arange(20, dtype=np.float32).reshape(5, 4)
    store.put("k", vectors, {"what": "test"})
    loaded = store.load("k")
    assert store.complete("k") and loaded is not None and np.array_equal(loaded, vectors)
    assert [len(c) for c in store.iter_chunks("k")] == [2, 2, 1]
    assert np.array_equal(store.shard("k", 1), vectors[2:4]) and store.meta("k")["what"] == "test"
    (tmp_path / "k" / "shard-00002.npy").unlink()
    assert not store.complete("k") and store.load("k") is None and store.load("absent") is None
    with pytest.raises(FileNotFoundError, match="absent or unfinished"):
        next(store.iter_chunks("k"))
    with pytest.raises(ContractMismatch, match=r"embedding-store key '\.\./k'"):
        store.entry("../k")


def test_shard_log_adopts_unlogged_shards_and_redoes_tampered_ones(tmp_path: Path) -> None:
    """A kill between writing a shard and logging it costs no re-encode; a modified shard is redone."""
    texts = [f"text {i}" for i in range(5)]
    calls: list[list[str]] = []

    def encode(batch: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        calls.append(list(batch))
        return np.ones((len(calls[-1]), 4), dtype=np.float32) * len(calls)

    store = EmbeddingStore(tmp_path, shard_size=2)
    store.encode("k", texts, encode, {}, progress=False)
    assert calls == [["text 0", "text 1"], ["text 2", "text 3"], ["text 4"]]
    log_path = tmp_path / "k" / SHARD_LOG
    lines = log_path.read_text().splitlines()
    log_path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])  # last record torn by a kill
    (tmp_path / "k" / "meta.json").unlink()
    (tmp_path / "k" / "shard-00001.npy").write_bytes(b"garbage")
    calls.clear()
    EmbeddingStore(tmp_path, shard_size=3).encode("k", texts, encode, {}, progress=False)  # keeps size 2
    assert calls == [["text 2", "text 3"]]
    events = [(r.shard, r.event) for r in ShardLog(tmp_path / "k").read()]
    assert events == [(0, "encoded"), (1, "encoded"), (2, "adopted"), (1, "encoded")]


def test_concurrent_encodes_of_one_entry_encode_each_shard_once(tmp_path: Path) -> None:
    texts = [f"text {i}" for i in range(5)]
    first_batch = threading.Event()
    calls: list[list[str]] = []

    def slow(batch: Sequence[str], on_progress: Callable[[int], object]) -> np.ndarray:
        first_batch.set()
        time.sleep(0.05)
        calls.append(list(batch))
        return np.full((len(calls[-1]), 4), len(calls), dtype=np.float32)

    store = EmbeddingStore(tmp_path, shard_size=2)
    results: dict[str, np.ndarray] = {}
    other = threading.Thread(target=lambda: results.update(a=store.encode("k", texts, slow, {}, progress=False)))
    other.start()
    assert first_batch.wait(10)
    results["b"] = store.encode("k", texts, slow, {}, progress=False)  # waits for the lock, then reuses
    other.join()
    assert len(calls) == 3 and np.array_equal(results["a"], results["b"])
    assert sorted(r.shard for r in store.shard_log("k")) == [0, 1, 2]
