"""Reading a BEIR queries file of a *train* split as extra training text.

Queries of the test split must never be trained on: when the file sits in a BEIR dataset
directory, every query id judged in `qrels/test.tsv` beside it is dropped.
"""

from __future__ import annotations

import logging
from pathlib import Path

from models.datasets.beir import QRELS_DIR, read_qrels, read_queries
from models.errors import InputError

log = logging.getLogger(__name__)


def read_train_queries(path: Path) -> list[str]:
    """Query texts in file order, minus the test split's; bad lines raise InputError naming file:line."""
    path = Path(path)
    queries = read_queries(path)
    test_qrels = path.parent / QRELS_DIR / "test.tsv"
    excluded = set(read_qrels(test_qrels)[0]) if test_qrels.is_file() else set()
    texts = [text for qid, text in queries.items() if qid not in excluded]
    if excluded:
        log.info("%s: %d training queries; dropped %d of the test split (%s)", path, len(texts),
                 len(queries) - len(texts), test_qrels)
    if not texts:
        raise InputError(f"{path}: no training queries left (all belong to the test split in {test_qrels})")
    return texts
