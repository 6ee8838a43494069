"""models.embeddings.shard_log: records append one line each, a line torn by a kill is skipped on read and the
next append starts a fresh line, and the latest record of each shard wins."""

from __future__ import annotations

from pathlib import Path

from models.embeddings.shard_log import SHARD_LOG, ShardLog, ShardRecord, entry_lock, now


def _record(shard: int, event: str = "encoded") -> ShardRecord:
    return ShardRecord.model_validate({"shard": shard, "start": 2 * shard, "end": 2 * shard + 2, "sha256": "ab",
                                       "event": event, "shard_size": 2, "at": now(), "pid": 1})


def test_a_torn_line_is_skipped_and_the_next_append_resumes_cleanly(tmp_path: Path) -> None:
    log = ShardLog(tmp_path)
    assert log.read() == [] and log.latest() == {}
    log.append(_record(0))
    log.append(_record(1))
    path = tmp_path / SHARD_LOG
    path.write_text(path.read_text()[:-15])  # the last append cut short by a kill
    assert [r.shard for r in log.read()] == [0]
    log.append(_record(1, "adopted"))
    log.append(_record(0, "stored"))
    assert [(r.shard, r.event) for r in log.read()] == [(0, "encoded"), (1, "adopted"), (0, "stored")]
    assert {k: r.event for k, r in log.latest().items()} == {0: "stored", 1: "adopted"}


def test_the_entry_lock_is_reentrant_across_uses(tmp_path: Path) -> None:
    with entry_lock(tmp_path):
        assert (tmp_path / ".lock").is_file()
    with entry_lock(tmp_path):  # released on exit: taken again at once
        pass
