"""Reading a model directory's setup and fingerprinting it (fast tier: config files only, nothing is loaded).

The fingerprint covers what changes a vector and nothing else: pooling, prompts, Dense layers and
lowercasing do; a trailing Normalize, include_prompt without prompts, and max_seq_length do not. A
model of tandem's original setup keeps the fingerprint the original formula gave it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.encoders.encoder_setup import EncoderSetup, Overrides
from models.encoders.registry import describe, fingerprint, load_card, resolve
from models.errors import InputError, ModelNotFound
from models.hashing import sha256_file

ST = "sentence_transformers.models."


def _model(root: Path, modules: list[tuple[str, str]] | None = None, pooling: dict | None = None,
           prompts: dict | None = None, weights: bytes = b"weights") -> Path:
    """A directory with the files describe() reads; the weights are bytes to hash, never loaded."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"hidden_size": 8, "max_position_embeddings": 66}))
    (root / "model.safetensors").write_bytes(weights)
    (root / "tokenizer.json").write_text("{}")
    if modules is not None:
        (root / "modules.json").write_text(json.dumps(
            [{"idx": i, "name": str(i), "path": path, "type": ST + kind} for i, (kind, path) in enumerate(modules)]))
        (root / "1_Pooling").mkdir(exist_ok=True)
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling or {"pooling_mode": "mean"}))
    if prompts is not None:
        (root / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return root


def _dense(root: Path, folder: str, in_features: int = 8, out_features: int = 4, weights: bytes = b"dense",
           activation: str = "torch.nn.modules.activation.Tanh") -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / "config.json").write_text(json.dumps(
        {"in_features": in_features, "out_features": out_features, "bias": True, "activation_function": activation}))
    (root / folder / "model.safetensors").write_bytes(weights)


BASE = [("Transformer", ""), ("Pooling", "1_Pooling")]


def test_the_original_setup_keeps_the_original_fingerprint(tmp_path: Path) -> None:
    plain = describe(_model(tmp_path / "plain"))
    st = describe(_model(tmp_path / "st", [*BASE, ("Normalize", "2_Normalize")],
                         pooling={"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}))
    original = fingerprint(plain.weights_sha256, "mean", 8, True)  # the formula before setups existed
    assert plain.fingerprint == st.fingerprint == original


def test_what_changes_a_vector_changes_the_fingerprint(tmp_path: Path) -> None:
    base = _model(tmp_path / "m", [*BASE, ("Normalize", "2_Normalize")])
    original = describe(base).fingerprint
    changed = {
        "pooling": describe(_model(tmp_path / "cls", BASE, pooling={"pooling_mode": "cls"})),
        "query prompt": describe(base, overrides=Overrides(query_prompt="query: ")),
        "document prompt": describe(base, overrides=Overrides(document_prompt="passage: ")),
    }
    dense = _model(tmp_path / "dense", [*BASE, ("Dense", "2_Dense"), ("Normalize", "3_Normalize")])
    _dense(dense, "2_Dense", out_features=8)
    changed["dense"] = describe(dense)
    _dense(dense, "2_Dense", out_features=8, weights=b"other dense")
    changed["dense weights"] = describe(dense)
    prints = [card.fingerprint for card in changed.values()]
    assert original not in prints and len(set(prints)) == len(prints)
    # …and what does not, does not: include_prompt without prompts, the path a model lies at
    unprompted = _model(tmp_path / "excluded", BASE, pooling={"pooling_mode": "mean", "include_prompt": False})
    assert describe(unprompted).fingerprint == original
    assert describe(unprompted, overrides=Overrides(query_prompt="q: ")).fingerprint != \
        describe(base, overrides=Overrides(query_prompt="q: ")).fingerprint


def test_prompts_for_queries_and_documents(tmp_path: Path) -> None:
    saved_by_st6 = {"prompts": {"query": "query: ", "document": "", "passage": "passage: "},
                    "default_prompt_name": None}
    card = describe(_model(tmp_path / "e5", BASE, prompts=saved_by_st6))
    assert (card.query_prompt, card.document_prompt) == ("query: ", "passage: ")  # an empty prompt hides none
    card = describe(_model(tmp_path / "default", BASE, prompts={"prompts": {"retrieval": "r: "},
                                                                 "default_prompt_name": "retrieval"}))
    assert (card.query_prompt, card.document_prompt) == ("r: ", "r: ")
    card = describe(_model(tmp_path / "given", BASE, prompts=saved_by_st6), overrides=Overrides(query_prompt=""))
    assert (card.query_prompt, card.document_prompt) == ("", "passage: ")


def test_dims_and_lengths(tmp_path: Path) -> None:
    root = _model(tmp_path / "m", [*BASE, ("Dense", "2_Dense")], prompts={"truncate_dim": 3})
    _dense(root, "2_Dense", out_features=6)
    assert describe(root).dim == 3
    assert describe(root).max_seq_length == 64  # min(positions − 2, 512) with nothing declared
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 40}))
    assert describe(root).max_seq_length == 40
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": True}))
    card = describe(root)
    assert (card.max_seq_length, card.lowercase) == (32, True)


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: _model(r, BASE, pooling={"pooling_mode": ["cls", "mean"]}), "combined"),
    (lambda r: _model(r, BASE, pooling={"pooling_mode": "attention"}), "'attention' is not one of"),
    (lambda r: _model(r, [*BASE, ("WeightedLayerPooling", "2_W")]), "tandem reads a Transformer, then Pooling"),
    (lambda r: _model(r, [("Pooling", "1_Pooling"), ("Transformer", "")]), "tandem reads a Transformer"),
    (lambda r: _model(r, [("Transformer", "../elsewhere"), ("Pooling", "1_Pooling")]), "leaves the model directory"),
    (lambda r: (_model(r, [*BASE, ("Dense", "2_Dense")]), _dense(r, "2_Dense", activation="mypkg.Act")),
     "not a torch.nn module"),
    (lambda r: (_model(r, [*BASE, ("Dense", "2_Dense")]), _dense(r, "2_Dense", in_features=5)),
     "Dense layer of 5 inputs after 8-d vectors"),
    (lambda r: _model(r, [*BASE, ("Dense", "2_Dense")]), "2_Dense/config.json is missing"),
    (lambda r: _model(r, BASE, prompts={"prompts": {"query": "q"}, "default_prompt_name": "doc"}),
     "default_prompt_name 'doc' is not among the prompts"),
    (lambda r: (r.mkdir(), (r / "modules.json").write_text("{")), "modules.json: not a readable JSON file"),
])
def test_what_tandem_cannot_run_exactly_is_refused_naming_the_file(tmp_path: Path, change, message: str) -> None:
    root = tmp_path / "m"
    change(root)
    with pytest.raises(ModelNotFound, match=message):
        describe(root)


def test_a_pooling_given_against_the_directorys_own_is_refused(tmp_path: Path) -> None:
    root = _model(tmp_path / "m", BASE, pooling={"pooling_mode": "cls"})
    assert describe(root, overrides=Overrides(pooling="cls")).pooling == "cls"
    with pytest.raises(InputError, match=r"1_Pooling/config\.json says cls"):
        describe(root, overrides=Overrides(pooling="mean"))


def test_a_card_written_before_setups_existed_reads_as_the_original_setup(tmp_path: Path) -> None:
    root = _model(tmp_path / "m")
    old = {"name": "m", "path": str(root), "weights_sha256": sha256_file(root / "model.safetensors"), "pooling": "mean",
           "dim": 8, "normalize": True, "max_seq_length": 64, "fingerprint": "f" * 64}
    (root / "tandem_model.json").write_text(json.dumps(old))
    card = load_card(root)
    assert card.fingerprint == "f" * 64  # recorded, never recomputed
    assert card.setup() == EncoderSetup()  # mean, no prompts, nothing after pooling


KNOWN_FINGERPRINTS = {  # what `tandem models fetch` printed before setups existed
    "teacher": "818ca08517a4448c35f573adf7a4b5ef338bec6f325ccc09a116aba5d52a9b65",
    "backbone": "d71459983f1b0cae900403a2bc3dacb79181cfe9e93717851af1c2d9dfb87218",
}


@pytest.mark.parametrize("role", sorted(KNOWN_FINGERPRINTS))
def test_the_default_models_keep_their_fingerprints(tandem_home: Path, role: str) -> None:
    card = describe(resolve(role))
    assert card.fingerprint == KNOWN_FINGERPRINTS[role]
    assert card.setup().identity() == {} and card.summary() == "pooling mean, no prompts"
