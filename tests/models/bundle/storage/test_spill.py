"""The on-disk counting sort lays out (code, row) records exactly as a stable in-memory sort by code would, over
any number of steps, and leaves no scratch file behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.bundle.storage import spill
from models.bundle.storage.spill import CodeSpill, new_array, save_array


@pytest.mark.parametrize("step", [7, 1 << 21])
def test_scatter_equals_a_stable_sort_by_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """On disk in steps of 7 records (past SPILL_AFTER), or all in RAM: the same layout."""
    monkeypatch.setattr(spill, "STEP_RECORDS", step)
    monkeypatch.setattr(spill, "SPILL_AFTER", min(step, 1 << 22))
    monkeypatch.setattr(spill, "WINDOW_ITEMS", min(step, 1 << 23))  # pages released every 7 items written
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 40, 500)
    rows = np.sort(rng.integers(0, 200, 500))  # appended in row order, codes in any order within a row
    weights = rng.random(500).astype(np.float32)
    remap = rng.permutation(45)  # five codes never seen
    s = CodeSpill(tmp_path / "x.spill", np.int32, {"w": np.float32})
    for part in np.array_split(np.arange(500), 9):
        s.append(codes[part], rows[part], w=weights[part])
    assert (tmp_path / "x.spill").exists() == (step == 7)
    out_rows, out_w = new_array(tmp_path / "rows.npy", np.int32, s.total), new_array(tmp_path / "w.npy", np.float32,
                                                                                      s.total)
    offsets = s.scatter(remap, {"row": out_rows, "w": out_w})
    s.remove()
    save_array(tmp_path / "rows.npy", out_rows)
    save_array(tmp_path / "w.npy", out_w)
    order = np.argsort(remap[codes], kind="stable")
    assert np.array_equal(np.load(tmp_path / "rows.npy"), rows[order])
    assert np.array_equal(np.load(tmp_path / "w.npy"), weights[order])
    assert np.array_equal(offsets, np.r_[0, np.cumsum(np.bincount(remap[codes], minlength=45))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.npy", "w.npy"]
