"""`tandem distill` with several members publishes the average of their weights, and says so in student.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.bundle.version import Bundle
from models.distill.pipeline import DistillRequest, run_distill
from models.distill.training.checkpoints import LAST
from models.encoders.student import StudentEncoder
from models.paths import cache_dir
from models.search import dense_hits
from tests.fixtures.corpus import PROBES
from tests.fixtures.student import TEST_PRESET, TEST_SEED


@pytest.mark.slow
def test_a_two_member_soup_is_published_with_each_members_record(
    tiny_bundle: Path, tiny_corpus: Path, tiny_student: Path, tmp_path: Path
) -> None:
    """Real models: the averaged weights must still find the probes. Each member trains one epoch, through int8 as
    the test preset's last epoch does; the first member's query targets are those the tiny student's distillation
    (same corpus, seed and queries) left in the store."""
    preset = TEST_PRESET.model_copy(update={"members": 2, "name": "soup", "epochs": 1})
    out = tmp_path / "soup"
    training = run_distill(DistillRequest(corpus=tiny_corpus, index=tiny_bundle, out=out, preset=preset,
                                          seed=TEST_SEED)).training

    members = training["members"]
    assert isinstance(members, list) and len(members) == 2
    assert members[0]["seed"] == TEST_SEED != members[1]["seed"]
    assert all(len(m["validation"]) == preset.epochs + 1 for m in members)  # before training, then each epoch
    soup = training["soup_validation"]
    assert isinstance(soup, dict) and soup["int8"] is True  # judged as it serves: the members trained through int8
    assert soup["steps"] == sum(m["steps"] for m in members)
    assert training["final_val_loss"] == soup["loss"]
    assert not list((cache_dir() / "checkpoints").glob(f"*/{LAST}"))  # the published soup supersedes them

    hits = dense_hits(Bundle(tiny_bundle), StudentEncoder(out, precision="int8").encode(list(PROBES)), k=1)
    assert {query: h[0].doc.id for query, h in zip(PROBES, hits, strict=True)} == PROBES
