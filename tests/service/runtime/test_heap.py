"""What a serving process leaves to the garbage collector: the start-up heap frozen, a bundle still collectable.

Full collections used to walk 93,000 start-up objects and, with a lexical index, bm25s's set of every token id,
stalling a loaded server process for 20–57 ms (docs/decisions.md#freeze-the-start-up-heap).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from models.bundle.lexical.postings import Bm25sIndex, PostingsIndex
from models.bundle.version import Bundle
from tests.fixtures.corpus import PROBES
from tests.indexer.versions.test_segments import _as_built_before_segments

REPO = Path(__file__).resolve().parents[3]

# Run in a fresh interpreter: freezing is for the life of a process, and this test process must stay as it is.
_FREEZE_THEN_LOAD = """
import gc, json, sys, weakref
from pathlib import Path
from service.runtime.heap import freeze_startup_heap
from service.core.loader import SearcherLoader
from service.settings import ServiceSettings

freeze_startup_heap()
frozen = gc.get_freeze_count()
loader = SearcherLoader(ServiceSettings(index=Path(sys.argv[1]), student=Path(sys.argv[2]), workers=1))
searcher = loader.load()
assert searcher.search_vectors(searcher.student.encode(["bread"]), 1)[0]
collectable = any(o is searcher for o in gc.get_objects())
gone = weakref.ref(searcher)
searcher.close()
del searcher
gc.collect()
print(json.dumps({"frozen": frozen, "collectable": collectable, "freed": gone() is None}))
"""


def test_the_startup_heap_is_frozen_and_a_bundle_loaded_after_it_is_freed(mini_bundle: Path,
                                                                           mini_student: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _FREEZE_THEN_LOAD, str(mini_bundle), str(mini_student)],
                          cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["frozen"] > 10_000  # the imports of service, FastAPI, onnxruntime, FAISS, bm25s
    assert state["collectable"], "the searcher was frozen with the start-up heap: retiring it would leak it"
    assert state["freed"], "a closed searcher outlived a full collection"


def test_the_lexical_index_keeps_no_python_container_of_its_vocabulary(mini_bundle: Path, tmp_path: Path) -> None:
    """Its stems and postings stay memory-mapped arrays; a bundle built before segments drops bm25s's set."""
    bundle = Bundle(mini_bundle)
    try:
        index = bundle.segments[0].lexical
        assert isinstance(index, PostingsIndex)
        for array in (index.terms.data, index.terms.offsets, index.offsets, index.rows, index.tf, index.lengths):
            assert isinstance(array, np.memmap)
        assert bundle.lexical is not None
        [(scores, rows)] = bundle.lexical.search(next(iter(PROBES)), 3, [None])
        assert len(rows) > 0 and scores[0] > 0
    finally:
        bundle.close()
    legacy = Bundle(_as_built_before_segments(mini_bundle, tmp_path / "old"))
    try:
        assert isinstance(legacy.lexical, Bm25sIndex)
        assert legacy.lexical.retriever.unique_token_ids_set is None
    finally:
        legacy.close()
