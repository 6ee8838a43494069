"""TANDEM_AGREEMENT_SAMPLE: the queries in each new segment's agreement sample, refused before any work when bad."""

from __future__ import annotations

from pathlib import Path

import pytest

from indexer.build import BuildRequest, build
from indexer.sample import SAMPLE_SETTING, sample_size
from models.agreement.draw import DEFAULT_SAMPLE
from models.errors import InputError


def test_the_setting_reads_a_whole_number_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SAMPLE_SETTING, raising=False)
    assert sample_size() == DEFAULT_SAMPLE
    monkeypatch.setenv(SAMPLE_SETTING, "0")
    assert sample_size() == 0
    for bad in ("-1", "many", "1.5"):
        monkeypatch.setenv(SAMPLE_SETTING, bad)
        with pytest.raises(InputError, match=SAMPLE_SETTING):
            sample_size()


def test_a_build_refuses_a_bad_setting_before_reading_anything(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv(SAMPLE_SETTING, "lots")
    with pytest.raises(InputError, match=SAMPLE_SETTING):
        build(BuildRequest(corpus=tmp_path / "absent.jsonl", out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_build_lets_the_teacher_go_after_its_sample(tandem_home: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    """A one-shot writer (build, update) frees the teacher once the sample's queries are encoded, before the staged
    version loads for their top-10: its peak memory holds one of the two. (A follower keeps it for its next step.)"""
    from models.encoders.teacher_cache import teacher_loads

    manifest = build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "out"))
    assert manifest.parts[0].name and teacher_loads().currsize == 0
