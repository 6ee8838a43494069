"""`tandem distill --from`: a student, continued on a segment of another domain that an update added.

Mechanics (what a refresh trains on, records and publishes), so the refresh runs on the tiny teacher and backbone
(tests/fixtures/tiny_service.py): teacher targets, the student's weights read back from its graph, training, export
and the parity gate are all real, on random weights. Reading weights back from a real backbone's optimized graph is
asserted on the real tiny student.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from indexer.sample import SAMPLE_SETTING
from indexer.versions.request import UpdateRequest
from indexer.versions.update import update
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import read_current
from models.distill.exporting.export import FP32_MIN_COSINE, INT8_MIN_COSINE
from models.distill.exporting.onnx_weights import load_onnx_weights
from models.distill.model import StudentModel
from models.distill.refresh import RefreshRequest, run_refresh
from models.distill.texts.tokens import Tokens, embed
from models.encoders.registry import load_card, resolve
from models.encoders.student import StudentEncoder, read_student_manifest
from models.errors import InputError
from tandem.provision import student_entry

NEW_DOCS = [
    ("os.path.join", "Join one or more path components intelligently, inserting a separator between them."),
    ("list.sort", "Sort the list in place, using only < comparisons between items; the sort is stable."),
    ("dict.get", "Return the value for key if key is in the dictionary, else default, which defaults to None."),
    ("str.split", "Return a list of the words in the string, using sep as the delimiter string."),
    ("itertools.chain", "Make an iterator that returns elements from the first iterable until it is exhausted."),
    ("functools.lru_cache", "Decorator to wrap a function with a memoizing callable that saves the recent calls."),
    ("subprocess.run", "Run the command described by args, wait for it to complete, return a CompletedProcess."),
    ("shutil.copytree", "Recursively copy an entire directory tree rooted at src to a directory named dst."),
    ("re.compile", "Compile a regular expression pattern into a regular expression object for matching."),
    ("time.monotonic", "Return the value of a monotonic clock, that cannot go backwards, in fractional seconds."),
]


@pytest.fixture(scope="module")
def grown_root(mini_root: Path, mini_teacher: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini root, copied, plus v2: an update adding the documents of another domain as one segment.

    The update writes no agreement sample: the refreshes here name their segment or have seen them all, so none is
    read (a sample's pick is tests/tandem/test_agreement_trigger.py's)."""
    root = tmp_path_factory.mktemp("refresh") / "root"
    shutil.copytree(mini_root, root, symlinks=True)
    changes = root.parent / "docstrings.jsonl"
    changes.write_text("".join(json.dumps({"_id": f"py-{i}", "title": t, "text": x}) + "\n"
                               for i, (t, x) in enumerate(NEW_DOCS)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SAMPLE_SETTING, "0")
        update(UpdateRequest(changes=changes, root=root, version="v2", teacher=mini_teacher))
    return root


@pytest.fixture(scope="module")
def refreshed(grown_root: Path, mini_student: Path, mini_teacher: Path, mini_backbone: Path) -> Path:
    """The added segment is named: a random-weight student agrees with its teacher everywhere, so the default pick
    (the segments it disagrees on) would find none. That pick, on real models and another domain, is asserted in
    tests/tandem/test_agreement_trigger.py."""
    out = grown_root.parent / "refreshed"
    added = read_bundle_manifest(read_current(grown_root)).parts[-1].name
    run_refresh(RefreshRequest(student=mini_student, index=grown_root, out=out, segments=[added],
                               teacher=mini_teacher, backbone=mini_backbone))
    return out


def test_the_student_s_weights_read_back_from_its_graph_reproduce_it(tiny_student: Path) -> None:
    manifest = read_student_manifest(tiny_student)
    backbone = load_card(resolve("backbone", None))
    model = StudentModel(backbone.hf_dir, manifest.teacher.dim, name=manifest.backbone)
    load_onnx_weights(model, tiny_student / manifest.onnx_fp32)
    texts = ["how do I make a loaf of bread rise", "Magma rises through the crust and erupts as lava."]
    tokens = Tokens(backbone.hf_dir / "tokenizer.json", manifest.max_seq_length)
    mine = embed(model, tokens, tokens.encode(texts), model.forward, torch.device("cpu"))
    graph = StudentEncoder(tiny_student, precision="fp32", threads=1).encode(texts)
    assert np.sum(mine * graph, axis=1).min() >= FP32_MIN_COSINE


def test_a_refreshed_student_passes_parity_and_records_what_it_was_trained_on(
        refreshed: Path, grown_root: Path, mini_student: Path) -> None:
    old = read_student_manifest(mini_student)
    new = read_student_manifest(refreshed)
    assert new.parity is not None
    assert new.parity.fp32_mean_cosine >= FP32_MIN_COSINE and new.parity.int8_mean_cosine >= INT8_MIN_COSINE
    assert old.trained_on is not None and new.trained_on is not None
    v2 = read_current(grown_root)
    added = [s.name for s in read_bundle_manifest(v2).parts][-1]
    assert new.trained_on.bundle == str(v2.resolve()) and new.trained_on.bundle_version == "v2"
    assert new.trained_on.segments == [s.name for s in read_bundle_manifest(v2).parts]  # seen, even once v2 is pruned
    assert old.trained_on.segments == [s.name for s in read_bundle_manifest(v2).parts][:-1]
    assert new.trained_on.corpus == old.trained_on.corpus  # the replay's source stays the corpus it was distilled on
    (last,) = new.trained_on.refreshes
    assert last.segments == [added] and last.documents == len(NEW_DOCS)
    assert last.student == str(mini_student.resolve()) and last.replayed_texts > 0
    assert new.teacher == old.teacher and new.backbone_fingerprint == old.backbone_fingerprint
    assert f"refreshed on segments {added} ({len(NEW_DOCS)} documents) of v2" in student_entry(refreshed).describe()
    vectors = StudentEncoder(refreshed, precision="int8", threads=1).encode(["Sort the list in place"])
    assert vectors.shape == (1, new.teacher.dim)


def test_a_second_refresh_finds_nothing_new(refreshed: Path, grown_root: Path, mini_teacher: Path,
                                            mini_backbone: Path) -> None:
    with pytest.raises(InputError, match=r"the student has seen every segment.*nothing to refresh on"):
        run_refresh(RefreshRequest(student=refreshed, index=grown_root, out=grown_root.parent / "again",
                                   teacher=mini_teacher, backbone=mini_backbone))


def test_a_segment_the_version_lacks_is_refused_by_name(mini_student: Path, grown_root: Path, mini_teacher: Path,
                                                        mini_backbone: Path) -> None:
    with pytest.raises(InputError, match="no segment named nope"):
        run_refresh(RefreshRequest(student=mini_student, index=grown_root, out=grown_root.parent / "x",
                                   segments=["nope"], teacher=mini_teacher, backbone=mini_backbone))
