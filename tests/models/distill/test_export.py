"""The exported ONNX student: graph contract, parity with PyTorch (every pooling mode), manifest, and retrieval."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from models.bundle.version import Bundle, read_bundle_manifest
from models.corpus import read_corpus
from models.distill.exporting.export import (
    FP32_MIN_COSINE,
    INT8_MIN_COSINE,
    check_parity,
    export_onnx,
    export_student,
    onnx_vectors,
    open_session,
    optimize_onnx,
    quantize_onnx,
    session_vectors,
    weight_matmuls,
)
from models.distill.exporting.mixed_precision import switch_input, switchable, with_fp32_nodes
from models.distill.model import StudentModel
from models.distill.texts.tokens import Tokens, embed
from models.distill.training.int8_emulation import activation_uint8, channel_int8, int8_emulation
from models.encoders.encoder_setup import POOLING_MODES
from models.encoders.registry import load_card, resolve
from models.encoders.student import StudentEncoder, read_student_manifest
from models.encoders.student_manifest import StudentManifest
from models.errors import ContractMismatch
from models.hashing import sha256_file
from models.search import dense_hits
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.tiny_models import MAX_SEQ_LENGTH, StSpec, TinyModels

pytestmark = pytest.mark.slow

TEXTS = [
    "hi",
    "parse a JSON string into a python dict",
    "why does the sea level go up and down every day",
    "The pancreas secretes insulin, which lets cells absorb glucose from the blood. " * 30,  # > 256 tokens
    "three-way handshake networking",
]


@pytest.fixture(scope="module")
def backbone_dir(tiny_models: TinyModels) -> Path:
    """The tiny BERT (tests/fixtures/tiny_models.py): tracing, fusing, quantizing, the parity gate and the int8
    emulation are mechanics, the same for any BERT-family backbone. The real backbone's export (and its parity
    gate) is the tiny student's (tests/fixtures/student.py), checked by the manifest tests below."""
    return load_card(tiny_models.st(StSpec(arch="bert", pooling="mean"))).hf_dir


@pytest.fixture(scope="module")
def exported(backbone_dir: Path, tandem_home: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[StudentModel, Path]:
    """An untrained student (projection = the backbone's own space, repeated into the real teacher's 768) exported
    for parity checks."""
    teacher = load_card(resolve("teacher")).teacher_ref()
    torch.manual_seed(0)
    model = StudentModel(backbone_dir, teacher.dim)
    dim = model.backbone_dim
    model.set_projection(torch.eye(dim).repeat(-(-teacher.dim // dim), 1)[: teacher.dim], torch.zeros(teacher.dim))
    card = load_card(backbone_dir)
    manifest = StudentManifest(teacher=teacher, backbone=card.name, backbone_fingerprint=card.fingerprint,
                               max_seq_length=card.max_seq_length)
    out = tmp_path_factory.mktemp("export") / "student"
    export_student(model, backbone_dir, manifest, out, parity_texts=TEXTS)
    return model, out


@functools.cache
def _tokens(backbone_dir: Path) -> Tokens:
    """Loaded once: the emulation test below embeds one text per call."""
    return Tokens(backbone_dir / "tokenizer.json", MAX_SEQ_LENGTH)


def _torch_vectors(model: StudentModel, backbone_dir: Path, texts: list[str]) -> np.ndarray:
    tokens = _tokens(backbone_dir)
    return embed(model, tokens, tokens.encode(texts), model.forward, torch.device("cpu"))


@pytest.mark.parametrize(("precision", "threshold"), [("fp32", FP32_MIN_COSINE), ("int8", INT8_MIN_COSINE)])
def test_onnx_matches_torch(exported: tuple[StudentModel, Path], backbone_dir: Path, precision: str,
                            threshold: float) -> None:
    model, out = exported
    texts = [*TEXTS, "tides", "a mortgage is a loan secured by real estate"]
    reference = _torch_vectors(model, backbone_dir, texts)
    onnx_vectors = StudentEncoder(out, precision=precision).encode(texts)  # type: ignore[arg-type]
    assert onnx_vectors.shape == (len(texts), 768)
    assert np.allclose(np.linalg.norm(onnx_vectors, axis=1), 1.0, atol=1e-4)
    assert float(np.sum(onnx_vectors * reference, axis=1).mean()) >= threshold


def test_parity_gate_rejects_a_graph_that_differs(exported: tuple[StudentModel, Path], backbone_dir: Path) -> None:
    _, out = exported
    other = StudentModel(backbone_dir, 768)  # default projection: another function entirely
    with pytest.raises(ContractMismatch, match="does not reproduce the PyTorch student"):
        check_parity(other, _tokens(backbone_dir), out, TEXTS)


def test_int8_emulation_predicts_the_int8_graph(exported: tuple[StudentModel, Path], backbone_dir: Path) -> None:
    """Quantization-aware training is only as good as torch's copy of ORT's rounding (one query per call)."""
    model, out = exported
    texts = [*TEXTS, "tides", "a mortgage is a loan secured by real estate"]
    graph = StudentEncoder(out, precision="int8")  # one session; one query per call, as served
    int8 = np.concatenate([graph.encode([text]) for text in texts])
    fp32 = np.concatenate([_torch_vectors(model, backbone_dir, [text]) for text in texts])
    with int8_emulation(model):
        emulated = np.concatenate([_torch_vectors(model, backbone_dir, [text]) for text in texts])

    def distance(vectors: np.ndarray) -> float:
        return float(np.mean(1.0 - np.sum(vectors * int8, axis=1)))

    assert distance(emulated) < distance(fp32) / 4


def test_the_switchable_graph_computes_each_mix_as_its_own_graph(exported: tuple[StudentModel, Path],
                                                                  backbone_dir: Path, tmp_path: Path) -> None:
    """The parity search's one session (mixed_precision.switchable): each mix of fp32 and int8 MatMuls, chosen by
    its flags, gives what that mix's own graph (with_fp32_nodes, the graph the search writes) gives."""
    _, out = exported
    quantize_onnx(out / "model.onnx", tmp_path / "int8.onnx")
    quantized, original = onnx.load(str(tmp_path / "int8.onnx")), onnx.load(str(out / "model.onnx"))
    candidates = weight_matmuls(out / "model.onnx")
    graph = switchable(quantized, original, candidates)
    onnx.checker.check_model(graph)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = _tokens(backbone_dir)
    everything = onnx_vectors(tmp_path / "int8.onnx", tokens, TEXTS)
    for excluded in ([], candidates[:1], candidates[1:], candidates[: len(candidates) // 2], candidates):
        flags = {switch_input(name): np.array(name in excluded) for name in candidates}
        vectors = session_vectors(session, tokens, TEXTS, flags)
        assert np.allclose(vectors, onnx_vectors(with_fp32_nodes(quantized, original, excluded).SerializeToString(),
                                                 tokens, TEXTS), atol=1e-6)
        assert np.allclose(vectors, everything, atol=1e-6) == (not excluded)  # the flags did change the answer
    with pytest.raises(ValueError, match="no such nodes"):
        switchable(quantized, original, ["/not/a/node"])


def test_int8_emulation_is_scoped_and_passes_gradients(backbone_dir: Path) -> None:
    model = StudentModel(backbone_dir, 768)
    keys = set(model.state_dict())
    input_ids = torch.tensor([[2, 70, 80, 90, 3, 0], [2, 70, 80, 90, 100, 3]])  # [CLS] … [SEP] [PAD] in its vocab
    with int8_emulation(model) as swapped:
        # the tiny BERT's 3 layers: six Linear per layer and the projection; three embedding tables and their
        # LayerNorm (MiniLM-L6's would be 6 * 6 + 1 + 4)
        assert swapped == 3 * 6 + 1 + 4
        assert set(model.state_dict()) == keys
        model(input_ids, (input_ids != 0).long()).sum().backward()
    assert type(model.projection) is nn.Linear and set(model.state_dict()) == keys
    assert model.projection.weight.grad is not None and model.projection.weight.grad.abs().sum() > 0
    assert model.backbone.embeddings.word_embeddings.weight.grad is not None
    with pytest.raises(RuntimeError, match="inside"), int8_emulation(model):
        raise RuntimeError("inside")
    assert type(model.backbone.embeddings.LayerNorm) is nn.LayerNorm
    with int8_emulation(model, enabled=False) as swapped:
        assert swapped == 0


def test_int8_emulation_rounds_a_weight_again_only_once_it_changed() -> None:
    """The rounded weights are kept per weight version: passes between optimizer steps (validation, one query per
    call) reuse them, a step rounds again, and values and gradients are those of rounding on every pass."""
    torch.manual_seed(0)
    first, second, x = nn.Linear(8, 16), nn.Linear(16, 4), torch.randn(3, 8)
    model = nn.Sequential(first, nn.ReLU(), second)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def every_pass() -> torch.Tensor:  # the emulation spelled out, rounding afresh
        hidden = F.linear(activation_uint8(x), channel_int8(first.weight), first.bias).relu()
        return F.linear(activation_uint8(hidden), channel_int8(second.weight), second.bias)

    for _ in range(3):
        with int8_emulation(model):
            out, again, reference = model(x), model(x), every_pass()
            assert torch.equal(out, reference) and torch.equal(again, reference)
            out.sum().backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            optimizer.zero_grad()
            reference.sum().backward()
            after = [p.grad for p in model.parameters()]
            assert len(grads) == 4
            assert all(b is not None and torch.equal(a, b) for a, b in zip(grads, after, strict=True))
            optimizer.step()  # in place: the next pass rounds the new weights
            optimizer.zero_grad()
        assert not [m for m in model if "_int8_rounded" in m.__dict__]  # nothing kept past the block


def test_fast_attention_computes_the_same_and_restores_eager(tiny_models: TinyModels) -> None:
    """Training attends through SDPA; vectors and gradients stay eager's, and export finds eager again. The switch
    is transformers' for any BERT, so a tiny one (tests/fixtures/tiny_models.py) shows it as MiniLM would."""
    hf_dir = tiny_models.hf("bert")
    torch.manual_seed(0)
    model = StudentModel(hf_dir, 768)
    tokens = Tokens(hf_dir / "tokenizer.json", MAX_SEQ_LENGTH)
    input_ids, mask = tokens.pad(tokens.encode(TEXTS))  # padded rows, a truncated one among them
    assert bool((mask == 0).any()) and int(mask.sum(dim=1).max()) == MAX_SEQ_LENGTH

    def vectors_and_grad() -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        out = model(input_ids, mask)
        out.sum().backward()
        assert model.projection.weight.grad is not None
        return out.detach(), model.projection.weight.grad.clone()

    eager = vectors_and_grad()
    with model.fast_attention() as attention:
        assert attention == "sdpa" == model.backbone.config._attn_implementation
        fused = vectors_and_grad()
    assert model.backbone.config._attn_implementation == "eager"
    assert torch.allclose(eager[0], fused[0], atol=1e-5) and torch.allclose(eager[1], fused[1], atol=1e-4)
    with pytest.raises(RuntimeError, match="inside"), model.fast_attention():
        raise RuntimeError("inside")
    assert model.backbone.config._attn_implementation == "eager"
    mpnet = tiny_models.st(StSpec(arch="mpnet", pooling="mean"))  # the architecture decides, not the weights
    teacher_layers = StudentModel(mpnet, 64, keep_layers=[0])
    with teacher_layers.fast_attention() as attention:  # MPNet has no SDPA path: it stays eager
        assert attention == "eager"


def test_graph_contract(tiny_student: Path) -> None:
    manifest = read_student_manifest(tiny_student)
    for name in (manifest.onnx_fp32, manifest.onnx_int8):
        session = ort.InferenceSession(str(tiny_student / name), providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in session.get_inputs()}
        assert set(inputs) == {"input_ids", "attention_mask"}
        assert all(isinstance(dim, str) for i in inputs.values() for dim in i.shape)  # dynamic batch, sequence
        (output,) = session.get_outputs()
        assert output.name == "embedding" and output.shape[1] == 768
    assert (tiny_student / manifest.tokenizer).is_file()
    fp32, int8 = (tiny_student / manifest.onnx_fp32).stat().st_size, (tiny_student / manifest.onnx_int8).stat().st_size
    assert int8 < 0.4 * fp32
    assert not [p for p in tiny_student.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_manifest_names_the_teacher_and_passes_parity(tiny_student: Path, tiny_bundle: Path) -> None:
    manifest = read_student_manifest(tiny_student)
    assert manifest.teacher.fingerprint == load_card(resolve("teacher")).fingerprint
    bundle = Bundle(tiny_bundle)
    bundle.check_student(manifest.teacher)
    assert manifest.backbone_fingerprint == load_card(resolve("backbone")).fingerprint
    assert manifest.max_seq_length == 256
    assert manifest.parity is not None
    assert manifest.parity.fp32_mean_cosine >= FP32_MIN_COSINE
    assert manifest.parity.int8_mean_cosine >= INT8_MIN_COSINE
    assert manifest.parity.int8_fp32_nodes == []  # MiniLM quantizes whole: nothing held back in fp32
    training = manifest.training
    assert training["preset"]["name"] == "test"  # type: ignore[index]
    assert training["epochs"] == 2 and isinstance(training["steps"], int) and training["steps"] > 0
    assert isinstance(training["final_val_loss"], float)
    history = training["validation"]  # before training, then after each epoch
    assert [h["steps"] for h in history] == sorted({h["steps"] for h in history}) and len(history) == 3
    assert all(0.0 <= h["overlap_at_10"] <= 1.0 for h in history)
    assert [h["int8"] for h in history] == [False, False, True]  # the last epoch trained through int8 rounding


def test_manifest_records_what_the_student_was_trained_on(tiny_student: Path, tiny_root: Path,
                                                         tiny_corpus: Path) -> None:
    """The fixture distilled against a bundle root: the version its CURRENT named is the one recorded."""
    trained_on = read_student_manifest(tiny_student).trained_on
    assert trained_on is not None
    assert trained_on.corpus == str(tiny_corpus.resolve())
    assert trained_on.corpus_sha256 == sha256_file(tiny_corpus)
    assert trained_on.documents == len(read_corpus(tiny_corpus))
    assert trained_on.bundle == str((tiny_root / "v1").resolve())
    # the manifest's own `version` where it records one, else the version's directory name (an --out build's copy)
    assert trained_on.bundle_version == (read_bundle_manifest(tiny_root / "v1").version or "v1")
    assert 0 < trained_on.train_queries < trained_on.train_texts and trained_on.real_queries == 0
    training = read_student_manifest(tiny_student).training
    assert trained_on.train_texts == training["texts"]["train"]  # type: ignore[index]


def test_a_student_from_before_provenance_still_loads(tiny_student: Path) -> None:
    older = read_student_manifest(tiny_student).model_dump(mode="json", exclude={"trained_on"})
    assert StudentManifest.model_validate(older).trained_on is None


def test_batching_does_not_change_vectors(tiny_student: Path) -> None:
    encoder = StudentEncoder(tiny_student, precision="fp32")
    batched = encoder.encode(TEXTS)
    single = np.concatenate([encoder.encode([t]) for t in TEXTS])
    assert np.allclose(batched, single, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_student_finds_the_probe_documents(tiny_student: Path, tiny_bundle: Path, precision: str) -> None:
    encoder = StudentEncoder(tiny_student, precision=precision)  # type: ignore[arg-type]
    hits = dense_hits(Bundle(tiny_bundle), encoder.encode(list(PROBES)), k=1)
    found = {query: h[0].doc.id for query, h in zip(PROBES, hits, strict=True)}
    assert found == PROBES


@pytest.mark.parametrize("pooling", POOLING_MODES)
def test_every_pooling_mode_traces_into_the_graph(tiny_models: TinyModels, tmp_path: Path, pooling: str) -> None:
    """A backbone's pooling is inside the ONNX graph: over padded batches of mixed lengths, ORT's fused graph
    gives what the PyTorch student gives, for every mode."""
    hf_dir = tiny_models.hf("bert", hidden=32)
    torch.manual_seed(0)
    model = StudentModel(hf_dir, 64, pooling=pooling).eval()  # type: ignore[arg-type]
    tokens = Tokens(hf_dir / "tokenizer.json", 48)
    export_onnx(model, tmp_path / "raw.onnx")
    optimize_onnx(tmp_path / "raw.onnx", tmp_path / "model.onnx", num_heads=4, hidden_size=32)
    texts = [t for t in TEXTS if len(t) < 200] + [text for _, _, text in DOCS[:6]]
    ours = onnx_vectors(tmp_path / "model.onnx", tokens, texts)
    reference = embed(model, tokens, tokens.encode(texts), model.forward, torch.device("cpu"))
    assert np.sum(ours * reference, axis=1).min() >= 0.9999


def test_export_sessions_run_torchs_thread_budget() -> None:
    """ORT reads neither OMP_NUM_THREADS nor torch's setting: the export's sessions (parity search and check) are
    given torch's thread count, so a run held to one thread (a test worker, a shared host) spins no second one."""
    graph = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "identity",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    threads = torch.get_num_threads()
    try:
        for budget in (1, 2):
            torch.set_num_threads(budget)
            options = open_session(graph.SerializeToString()).get_session_options()
            assert (options.intra_op_num_threads, options.inter_op_num_threads) == (budget, 1)
    finally:
        torch.set_num_threads(threads)
