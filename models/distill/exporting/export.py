"""Export a trained StudentModel to the ONNX student directory, and prove it matches PyTorch.

Classic (TorchScript) exporter with eager attention → ORT transformer optimizer (fused
attention, embedding layer norm, GELU; its SkipLayerNormalization split back, which runs faster) →
model.onnx (fp32) → per-channel dynamic int8 → model.int8.onnx. Per-tensor int8 loses too much (mean cosine
≈ 0.94 against fp32), per-channel keeps ≈ 0.99. Parity against PyTorch on held-out texts is a hard gate: a student that
does not reproduce its own training graph is never published.
"""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.optimizer import optimize_model

from models.bundle.staging import staged
from models.distill.exporting.mixed_precision import switch_input, switchable, with_fp32_nodes
from models.distill.model import StudentModel
from models.distill.texts.tokens import Tokens, embed
from models.encoders.graph import FUSED, split_skip_layer_norms
from models.encoders.student import StudentEncoder, session_options
from models.encoders.student_manifest import STUDENT_MANIFEST, ParityReport, StudentManifest
from models.errors import ContractMismatch

log = logging.getLogger(__name__)

FP32_MIN_COSINE = 0.999
INT8_MIN_COSINE = 0.99
OPSET = 17
RAW_FILE = "model.raw.onnx"


def export_onnx(model: StudentModel, path: Path) -> None:
    """Trace the student (inputs input_ids, attention_mask; output embedding) with dynamic batch and sequence."""
    model = model.to("cpu").eval()
    input_ids = torch.tensor([[101, 7592, 2088, 2003, 102, 0], [101, 7592, 2088, 2003, 2172, 102]])
    mask = (input_ids != 0).long()
    input_ids = input_ids % int(model.backbone.config.vocab_size)  # any ids the embeddings hold trace the same graph
    dynamic = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        # The classic exporter on purpose: ORT's BERT fusions match its graph (on MiniLM-L6: 6 Attention,
        # 12 SkipLayerNormalization, 1 EmbedLayerNormalization). Its deprecation and tracer notes are
        # noise here; check_parity() is what proves the graph right.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
        torch.onnx.export(
            model,
            (input_ids, mask),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": dynamic, "attention_mask": dynamic, "embedding": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def optimize_onnx(raw: Path, out: Path, num_heads: int, hidden_size: int) -> dict[str, int]:
    """ORT's BERT fusions, less SkipLayerNormalization (split back: models.encoders.graph says why); returns the
    fused operator counts (Attention should be one per layer)."""
    optimized = optimize_model(str(raw), model_type="bert", num_heads=num_heads, hidden_size=hidden_size)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    split = split_skip_layer_norms(optimized.model)
    if split:
        fused[f"{FUSED} (split back into Add + LayerNormalization)"] = fused.pop(FUSED, split)
    optimized.save_model_to_file(str(out))
    return fused


def quantize_onnx(
    fp32: Path, out: Path, nodes_to_exclude: Sequence[str] = (), reduce_range: bool = True,
    weight_type: QuantType = QuantType.QInt8,
) -> None:
    """Per-channel dynamic int8 weights in 7 bits; fused ORT ops lack shape info, hence the default tensor type.

    Without VNNI (AVX2), ORT multiplies uint8 activations by int8 weights with vpmaddubsw, which
    sums product pairs into int16 and saturates; 7-bit weights ([-64, 64]) cannot. On a
    random-init student's graph the full range cost 1 − cos 0.0172 against fp32 there, 7 bits
    0.0075; on a trained one the two were level. int8_emulation.py trains against the same range.

    ORT's quantizer logs a few lines per tensor on the root logger; they are held back to warnings.
    """
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        quantize_dynamic(
            fp32, out, per_channel=True, reduce_range=reduce_range, weight_type=weight_type,
            nodes_to_exclude=list(nodes_to_exclude),
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.setLevel(level)


def weight_matmuls(path: Path) -> list[str]:
    """Names of the MatMul nodes with a constant operand: the ones dynamic quantization turns int8."""
    graph = onnx.load(str(path)).graph
    constants = {init.name for init in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and any(i in constants for i in n.input)]


def open_session(graph: Path | bytes) -> ort.InferenceSession:
    """An ONNX student graph (a file, or a serialized model) in a CPU session of the export's thread budget: as many
    threads as torch was given (OMP_NUM_THREADS, torch.set_num_threads), the budget the student trained on."""
    return ort.InferenceSession(graph if isinstance(graph, bytes) else str(graph),
                                session_options(torch.get_num_threads()), providers=["CPUExecutionProvider"])


def onnx_vectors(graph: Path | bytes, tokens: Tokens, texts: Sequence[str]) -> np.ndarray:
    """Run an ONNX student graph (a file, or a serialized model) directly (no student directory needed yet); rows
    in input order."""
    return session_vectors(open_session(graph), tokens, texts)


def session_vectors(session: ort.InferenceSession, tokens: Tokens, texts: Sequence[str],
                    extra: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """Run an ONNX student session on texts, with `extra` inputs (a switchable graph's flags); rows in input order.

    Texts go in length-sorted calls of 64 (Tokens.map_sorted). In one call, 200 parity queries
    padded to the passages' 256 tokens took a teacher-layer student's int8 graph 49 s and 4.9 GB,
    against 12 s and 1.3 GB in calls of 64, and the parity search makes dozens of such passes.
    """
    names = {i.name for i in session.get_inputs()}

    def run(input_ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        feed = {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()}
        return np.asarray(session.run(None, {k: v for k, v in feed.items() if k in names} | dict(extra or {}))[0])

    return tokens.map_sorted(tokens.encode(texts), run)


def quantize_with_parity(fp32: Path, out: Path, tokens: Tokens, texts: Sequence[str]) -> list[str]:
    """Quantize every weight MatMul; if the int8 graph misses the parity gate, keep the most sensitive ones fp32.

    Some students carry activation outliers that per-tensor dynamic activation scales cannot
    represent (a teacher cut down to its first and last layers feeds layer 0's output into the
    last layer). Each candidate's sensitivity is the mean cosine to fp32 when it alone is
    quantized; the worst are excluded one by one until the whole graph passes. Returns the
    excluded node names (empty for a graph that passes as is, such as MiniLM's). The graph is
    quantized once, and the search scores its mixes in one session of one graph in which every
    candidate runs both ways, flags choosing (mixed_precision.switchable). The mix that passes there is
    checked again as the graph that is written, that graph with those MatMuls put back in fp32
    (mixed_precision.with_fp32_nodes: what quantize_dynamic writes excluding them, test_mixed_precision.py).
    """
    reference = onnx_vectors(fp32, tokens, texts)
    quantize_onnx(fp32, out)

    def score(vectors: np.ndarray) -> float:
        return float(np.mean(np.sum(vectors * reference, axis=1)))

    if score(onnx_vectors(out, tokens, texts)) >= INT8_MIN_COSINE:
        return []
    candidates = weight_matmuls(fp32)
    quantized, original = onnx.load(str(out)), onnx.load(str(fp32))
    session = open_session(switchable(quantized, original, candidates).SerializeToString())

    def cosine(excluded: Sequence[str]) -> float:
        flags = {switch_input(name): np.array(name in excluded) for name in candidates}
        return score(session_vectors(session, tokens, texts, flags))

    sensitivity = sorted(candidates, key=lambda name: cosine([n for n in candidates if n != name]))
    excluded, written = sensitivity, None
    for n in range(1, len(sensitivity) + 1):
        if cosine(sensitivity[:n]) < INT8_MIN_COSINE:
            continue
        kept = with_fp32_nodes(quantized, original, sensitivity[:n])
        score_kept = score(onnx_vectors(kept.SerializeToString(), tokens, texts))
        log.info("int8: %d of %d MatMuls kept in fp32, cosine to fp32 %.5f", n, len(candidates), score_kept)
        if score_kept >= INT8_MIN_COSINE:
            excluded, written = sensitivity[:n], kept
            break
    if written is None:
        written = with_fp32_nodes(quantized, original, excluded)
    onnx.save(written, str(out))  # what quantizing again would write
    return excluded


def check_parity(model: StudentModel, tokens: Tokens, directory: Path, texts: Sequence[str]) -> ParityReport:
    """Mean cosine of each ONNX precision against PyTorch; raises if below the gates."""
    reference = embed(model, tokens, tokens.encode(texts), model.forward, torch.device("cpu"))
    cosines = {}
    for precision in ("fp32", "int8"):
        onnx_vectors = StudentEncoder(directory, precision=precision, threads=torch.get_num_threads()).encode(texts)
        cosines[precision] = np.sum(onnx_vectors * reference, axis=1)
    report = ParityReport(
        texts=len(texts),
        fp32_mean_cosine=float(cosines["fp32"].mean()),
        int8_mean_cosine=float(cosines["int8"].mean()),
        int8_min_cosine=float(cosines["int8"].min()),
    )
    log.info("parity on %d held-out texts: fp32 %.5f, int8 %.5f (min %.4f)", report.texts, report.fp32_mean_cosine,
             report.int8_mean_cosine, report.int8_min_cosine)
    if report.fp32_mean_cosine < FP32_MIN_COSINE or report.int8_mean_cosine < INT8_MIN_COSINE:
        raise ContractMismatch(
            f"ONNX export does not reproduce the PyTorch student: mean cosine fp32 {report.fp32_mean_cosine:.5f} "
            f"(needs ≥ {FP32_MIN_COSINE}), int8 {report.int8_mean_cosine:.5f} (needs ≥ {INT8_MIN_COSINE})"
        )
    return report


def export_student(
    model: StudentModel,
    backbone_dir: Path,
    manifest: StudentManifest,
    out: Path,
    parity_texts: Sequence[str],
    force: bool = False,
) -> StudentManifest:
    """Write the student directory atomically; `manifest` is completed with the parity report."""
    started = time.perf_counter()
    tokens = Tokens(Path(backbone_dir) / "tokenizer.json", manifest.max_seq_length)
    config = model.backbone.config
    with staged(Path(out), force) as staging:
        export_onnx(model, staging / RAW_FILE)
        fused = optimize_onnx(staging / RAW_FILE, staging / manifest.onnx_fp32, int(config.num_attention_heads),
                              int(config.hidden_size))
        log.info("ORT fusions: %s", fused)
        (staging / RAW_FILE).unlink()
        kept_fp32 = quantize_with_parity(staging / manifest.onnx_fp32, staging / manifest.onnx_int8, tokens,
                                         parity_texts)
        if kept_fp32:
            log.warning("int8: %d MatMuls stay fp32 to hold parity: %s", len(kept_fp32), ", ".join(kept_fp32))
        shutil.copyfile(Path(backbone_dir) / "tokenizer.json", staging / manifest.tokenizer)
        (staging / STUDENT_MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
        parity = check_parity(model, tokens, staging, parity_texts).model_copy(update={"int8_fp32_nodes": kept_fp32})
        manifest = manifest.model_copy(update={"parity": parity})
        (staging / STUDENT_MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    log.info("student exported to %s in %.1fs", out, time.perf_counter() - started)
    return manifest
