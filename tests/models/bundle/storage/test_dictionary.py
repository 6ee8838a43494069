"""models.bundle.storage.dictionary: strings coded in the order first met come back sorted, found by value, and their
offsets are the running sums of their sizes."""

from __future__ import annotations

import numpy as np

from models.bundle.storage.dictionary import Dictionary, run_offsets, sorted_dictionary


def test_sorted_dictionary_round_trips_through_dictionary() -> None:
    codes = {"pear": 0, "apple": 1, "été": 2, "fig": 3}  # as first met; one non-ASCII string
    remap, data, offsets = sorted_dictionary(codes)
    words = Dictionary(np.frombuffer(data, dtype=np.uint8), offsets)
    assert list(words) == ["apple", "fig", "pear", "été"]
    assert len(words) == 4 and words[1:3] == ["fig", "pear"]
    for word, code in codes.items():
        assert words[int(remap[code])] == word
        assert words.find(word) == remap[code]
    assert words.find("banana") is None and words.find("zzz") is None


def test_an_empty_dictionary_holds_nothing() -> None:
    remap, data, offsets = sorted_dictionary({})
    words = Dictionary(np.frombuffer(data, dtype=np.uint8), offsets)
    assert len(remap) == 0 and len(words) == 0 and words.find("a") is None


def test_run_offsets_are_where_each_run_starts_then_the_end() -> None:
    offsets = run_offsets([3, 0, 2])
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [0, 3, 3, 5]
    assert run_offsets(np.bincount([2, 0, 2, 2])).tolist() == [0, 1, 1, 4]
    assert run_offsets([]).tolist() == [0]
