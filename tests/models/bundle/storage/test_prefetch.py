"""models.bundle.storage.prefetch: warming a version's memory-mapped files never fails a load, even for a file gone."""

from __future__ import annotations

import threading
from pathlib import Path

from models.bundle.storage.prefetch import prefetch


def test_prefetch_reads_what_exists_and_passes_over_what_is_gone(tmp_path: Path) -> None:
    present = tmp_path / "rescore.u8.npy"
    present.write_bytes(b"\0" * 65_536)
    prefetch([tmp_path / "pruned.npy", present])
    for thread in [t for t in threading.enumerate() if t.name == "tandem-prefetch"]:
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert present.read_bytes() == b"\0" * 65_536
