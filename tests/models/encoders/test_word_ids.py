"""The word cache gives the tokenizer's own ids, and the static table's lean sum the same bits as the plain one."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from models.encoders.static_table import StaticTable
from models.encoders.student import load_tokenizer
from models.encoders.word_ids import WordIds
from tests.fixtures.tiny_models import _tokenizer

TEXTS = [
    "", " ", "a", "What causes ocean tides?", "DNA-repair in BRCA1/BRCA2 carriers: 3.5% vs. 12% (n=40)",
    "UPPER lower MiXeD", "don't stop_believing ~ `code` {x: [1, 2]} <tag> a|b \\ c", "   many   spaces  ",
    "tab\tand\nnew line\r", "ctrl\x01char\x1fjoined", "café naïve résumé", "Ünïcödé ÀÉÎÕÜ", "東京の天気 是什么",
    "emoji 🙂 here", "non\u00a0breaking\u2003space", "zero\u200bwidth", "x" * 120, "querypassage" * 9,
    "[MASK] and <mask> and [cls] <s>", "a\x00b", "\ufffdreplacement", "Ελληνικά и русский",
]


def _random_texts(n: int) -> list[str]:
    rng = random.Random(0)
    pieces = ["query", "passage", "search", "the", "Document", "of", ",", ".", "!", "?", "-", "'", "(", ")", "é",
              "ß", "中", "  ", "\t", "42", "x9", "##", "_", "@", "represent"]
    return ["".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(0, 60))) for _ in range(n)]


@pytest.mark.parametrize("arch", ["bert", "mpnet"])  # lower-cased and cased normalizers
@pytest.mark.parametrize("max_length", [16, 512])  # truncating and not
def test_word_ids_are_the_tokenizers(tmp_path: Path, arch: str, max_length: int) -> None:
    _tokenizer(arch, tmp_path)  # type: ignore[arg-type]
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json", max_length)
    word_ids = WordIds.for_tokenizer(tokenizer)
    assert word_ids is not None
    for text in TEXTS + _random_texts(400):
        assert word_ids.ids(text) == tokenizer.encode(text).ids, text
        assert word_ids.ids(text) == tokenizer.encode(text).ids, text  # again, from the filled cache
    assert word_ids.words  # the ASCII texts went through the cache


def test_other_tokenizers_keep_the_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    assert WordIds.for_tokenizer(tokenizer) is None


def test_static_sum_is_bit_for_bit(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((500, 48)).astype(np.float32)
    np.save(tmp_path / "table.npy", rows)
    table = StaticTable(tmp_path / "table.npy", 48)
    for n in [1, 2, 7, 22, 130]:
        ids = [int(i) for i in rng.integers(0, 500, n)]
        total = rows[np.asarray(ids, dtype=np.intp)].sum(axis=0, dtype=np.float32)
        assert np.array_equal(table.encode(ids), total / float(np.linalg.norm(total)))
    assert not table.encode([]).any()
