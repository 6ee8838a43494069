"""`tandem distill` with several members publishes the average of their weights, and says so in student.json.

Mechanics (members, their records, the soup's validation, the published graph), so the teacher and backbone are the
tiny ones (tests/fixtures/tiny_service.py): their answers are not relevant, so the soup is judged against its
members in the teacher's space instead of on the probes. That the real student finds the probes is
tests/models/distill/test_export.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.bundle.version import Bundle
from models.distill.exporting.export import FP32_MIN_COSINE, INT8_MIN_COSINE
from models.distill.pipeline import DistillRequest, run_distill
from models.distill.training.checkpoints import LAST
from models.encoders.student import StudentEncoder
from models.paths import cache_dir
from models.search import dense_hits
from tests.fixtures.corpus import PROBES
from tests.fixtures.student import TEST_PRESET, TEST_SEED


@pytest.mark.slow
def test_a_two_member_soup_is_published_with_each_members_record(
    mini_bundle: Path, mini_teacher: Path, mini_backbone: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    """Each member trains one epoch, through int8 as the test preset's last epoch does."""
    preset = TEST_PRESET.model_copy(update={"members": 2, "name": "soup", "epochs": 1})
    out = tmp_path / "soup"
    manifest = run_distill(DistillRequest(corpus=tiny_corpus, index=mini_bundle, out=out, preset=preset,
                                          seed=TEST_SEED, teacher=mini_teacher, backbone=mini_backbone))
    training = manifest.training

    members = training["members"]
    assert isinstance(members, list) and len(members) == 2
    assert members[0]["seed"] == TEST_SEED != members[1]["seed"]
    assert all(len(m["validation"]) == preset.epochs + 1 for m in members)  # before training, then each epoch
    soup = training["soup_validation"]
    assert isinstance(soup, dict) and soup["int8"] is True  # judged as it serves: the members trained through int8
    assert soup["steps"] == sum(m["steps"] for m in members)
    assert training["final_val_loss"] == soup["loss"]
    # the averaged weights still work: on the members' shared validation texts, against the teacher's vectors, no
    # worse than the worse member ended
    finals = [m["validation"][-1] for m in members]
    assert soup["loss"] <= max(f["loss"] for f in finals)
    assert soup["overlap_at_10"] >= min(f["overlap_at_10"] for f in finals)
    assert not list((cache_dir() / "checkpoints").glob(f"*/{LAST}"))  # the published soup supersedes them

    # the published graphs are the soup's (the parity gate ran against the averaged weights), and serve
    assert manifest.parity is not None
    assert manifest.parity.fp32_mean_cosine >= FP32_MIN_COSINE and manifest.parity.int8_mean_cosine >= INT8_MIN_COSINE
    hits = dense_hits(Bundle(mini_bundle), StudentEncoder(out, precision="int8").encode(list(PROBES)), k=3)
    assert [len(h) for h in hits] == [3] * len(PROBES)
