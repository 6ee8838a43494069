"""A `tandem distill` killed mid-training resumes from its checkpoint and ends where an uninterrupted run ends.

Mechanics (checkpoints, resume, the same end state), so the teacher and backbone are the tiny ones
(tests/fixtures/tiny_home.py). The run that is killed is a `tandem distill` command in a process of its own (SIGKILL
needs one), forked from this one (tests/fixtures/kill_points.py `run_cli`: no interpreter start nor torch import to
pay), and killed by its own audit hook just after its first epoch's checkpoint is in place, not when a poll sees it;
the resumed run and the uninterrupted one run `run_distill` in this process, as that command does, on one torch thread
as the fork runs, so that every epoch is computed alike."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from models.distill.pipeline import DistillRequest, run_distill
from models.distill.training.checkpoints import LAST
from models.encoders.student import StudentEncoder, read_student_manifest
from tests.fixtures.corpus import PROBES
from tests.fixtures.kill_points import run_cli
from tests.fixtures.student import TEST_PRESET, TEST_SEED

EPOCHS = 2


def _request(corpus: Path, bundle: Path, out: Path, preset: Path) -> DistillRequest:
    """What `_distill`'s command line asks (the preset by its file, as the command passes it), for run_distill."""
    return DistillRequest(corpus=corpus, index=bundle, out=out, preset=str(preset), seed=TEST_SEED)


def _distill(corpus: Path, bundle: Path, out: Path, preset: Path) -> list[str]:
    return ["distill", "--corpus", str(corpus), "--index", str(bundle), "--out", str(out), "--preset", str(preset),
            "--seed", str(TEST_SEED)]


def _kill_after_first_checkpoint(tmp_path: Path, argv: list[str]) -> None:
    """`tandem ARGV`, SIGKILLed as soon as its first epoch's checkpoint is in place: at the first file it opens after
    renaming last.pt into place (models.atomic.atomic_write: the checkpoint directory, to fsync the rename)."""

    def kill_after_checkpoint() -> None:
        renamed = False

        def hook(event: str, args: tuple[object, ...]) -> None:
            nonlocal renamed
            if event == "os.rename" and isinstance(args[1], (str, os.PathLike)) \
                    and os.path.basename(os.fspath(args[1])) == LAST:  # os.replace audits as os.rename
                renamed = True
            elif renamed and event == "open":
                os.kill(os.getpid(), signal.SIGKILL)

        sys.addaudithook(hook)

    done = run_cli(tmp_path, argv, {"TANDEM_LOG_LEVEL": "WARNING"}, kill_after_checkpoint)
    assert done.killed, f"the run ended before it could be interrupted: {done.stderr[-2000:]}"


@pytest.mark.slow
def test_killed_distill_resumes_and_matches_an_uninterrupted_run(
    tiny_home: Path, tiny_teacher_bundle: Path, tiny_corpus: Path, tmp_path: Path
) -> None:
    tiny_bundle = tiny_teacher_bundle
    preset = tmp_path / "preset.json"
    preset.write_text(TEST_PRESET.model_copy(update={"epochs": EPOCHS, "name": "resume"}).model_dump_json())
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"

    _kill_after_first_checkpoint(tmp_path, _distill(tiny_corpus, tiny_bundle, resumed, preset))
    assert not resumed.exists()  # nothing half-published
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run_cli's fork trained the first epoch
    try:
        run_distill(_request(tiny_corpus, tiny_bundle, resumed, preset))
        run_distill(_request(tiny_corpus, tiny_bundle, straight, preset))
    finally:
        torch.set_num_threads(threads)

    a, b = read_student_manifest(resumed).training, read_student_manifest(straight).training
    assert a["resumed_from_epoch"] in range(1, EPOCHS) and b["resumed_from_epoch"] is None
    assert a["epochs"] == b["epochs"] == EPOCHS and a["steps"] == b["steps"]
    history_a, history_b = json.loads(json.dumps(a["validation"])), json.loads(json.dumps(b["validation"]))
    assert len(history_a) == len(history_b) == EPOCHS + 1  # before training, then after each epoch
    for x, y in zip(history_a, history_b, strict=True):
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-4)
    queries = list(PROBES)
    va = StudentEncoder(resumed, precision="fp32").encode(queries)
    vb = StudentEncoder(straight, precision="fp32").encode(queries)
    assert np.allclose(va, vb, atol=1e-3)


def test_a_checkpoint_written_before_the_trainer_moved_still_loads(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """last.pt pickles the run's TrainResult by its module: one written while the trainer was
    models.distill.trainer (before issue 54) loads as models.distill.training.trainer's."""
    import types

    from models.distill.training import checkpoints, trainer

    old = types.ModuleType("models.distill.trainer")
    old.TrainResult = trainer.TrainResult  # type: ignore[attr-defined]
    with monkeypatch.context() as m:  # pickled as the old tree pickled it, by the old module's name
        m.setitem(sys.modules, "models.distill.trainer", old)
        m.setattr(trainer.TrainResult, "__module__", "models.distill.trainer")
        checkpoints.save({"result": trainer.TrainResult(epochs=3, steps=7)}, tmp_path / LAST)
    assert b"models.distill.trainer" in (tmp_path / LAST).read_bytes()
    state = checkpoints.load_last(tmp_path, torch.device("cpu"))
    assert state is not None
    result = state["result"]
    assert isinstance(result, trainer.TrainResult) and (result.epochs, result.steps) == (3, 7)
