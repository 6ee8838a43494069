"""The student encoder at serving time: tokenizers + onnxruntime, no torch.

Pooling, projection and normalization live inside the ONNX graph, so this module only
tokenizes, runs the session and returns unit vectors in the teacher's space.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import BertPreTokenizer, Whitespace, WhitespaceSplit

from models.contract import TeacherRef
from models.encoders.graph import split_skip_layer_norms
from models.encoders.heap import return_freed_heap
from models.encoders.precision import StudentPrecision
from models.encoders.static_table import StaticTable
from models.encoders.student_manifest import STUDENT_MANIFEST, StudentManifest
from models.encoders.word_ids import WordIds
from models.manifest_io import read_manifest
from models.timing import StageObserver

if TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger(__name__)

# onnxruntime's own fusion of Add + LayerNormalization into SkipLayerNormalization, which the split graph exists to
# avoid (models.encoders.graph); it matches the optimizer's unfused form, not the split one, but stays off either way
KEEP_SPLIT = ["SkipLayerNormFusion"]
# pre-tokenizers that split on whitespace and drop it: a run of spaces tokenizes like one
WHITESPACE_SPLITTERS = (BertPreTokenizer, Whitespace, WhitespaceSplit)

def read_student_manifest(directory: Path) -> StudentManifest:
    return read_manifest(Path(directory) / STUDENT_MANIFEST, StudentManifest, "student")


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """Truncate at `max_length`; pad to the batch's longest text with the tokenizer's own pad token.

    The pad token comes from the file's padding config where it has one (MPNet's is `<pad>`, id 1,
    while its vocabulary also holds an unrelated `[PAD]`), else BERT's `[PAD]`.
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length=max_length)
    configured = tokenizer.padding or {}
    pad_token = configured.get("pad_token") or "[PAD]"
    pad_id = configured.get("pad_id", tokenizer.token_to_id(pad_token) or 0)
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return tokenizer


class StudentEncoder:
    """Encodes queries with the exported student; thread-safe (ORT sessions are, and a static table is read-only).

    A transformer student runs its ONNX graph; a static one (manifest `architecture`) averages rows of its token
    table (models.encoders.static_table), with the same tokenizer, normalization and identity.
    """

    def __init__(self, directory: Path, precision: StudentPrecision = "int8", threads: int = 1) -> None:
        self.directory = Path(directory).resolve()
        self.manifest = read_student_manifest(self.directory)
        self.tokenizer = load_tokenizer(self.directory / self.manifest.tokenizer, self.manifest.max_seq_length)
        model_file = self.manifest.model_file(precision)
        stat = (self.directory / model_file).stat()
        # what a query vector depends on besides the text: another graph, or this one rewritten, is another identity
        self.identity = (str(self.directory), model_file, stat.st_size, stat.st_mtime_ns)
        self._normalizer = self.tokenizer.normalizer
        self._collapse_spaces = isinstance(self.tokenizer.pre_tokenizer, WHITESPACE_SPLITTERS)
        self._word_ids = WordIds.for_tokenizer(self.tokenizer)  # one query's ids without the tokenizer's call
        self.static: StaticTable | None = None
        if self.manifest.architecture == "static":
            self.static = StaticTable(self.directory / model_file, self.dim)
        else:
            self.session = open_graph(self.directory / model_file, session_options(threads))
            self._inputs = {i.name for i in self.session.get_inputs()}
            self._masked = "attention_mask" in self._inputs
        self.precision = precision
        self.observe: StageObserver | None = None  # told how long tokenization took, when set (metrics)
        log.info("student %s (%s, %s)", self.directory, self.manifest.architecture,
                 "static table" if self.static is not None else f"{precision}, {threads} threads")

    def close(self) -> None:
        """Let the ONNX session (or the static table) and the tokenizer go now rather than when the last reference to
        this encoder is collected (a closed searcher sits in a reference cycle until the garbage collector's next full
        pass, and what that pass frees is never trimmed: a few MiB a student change), and hand the heap back to the
        OS: the service's student pool calls it once no searcher holds the student. Encoding after it raises
        AttributeError."""
        if self.static is not None:
            del self.static.rows, self.static._plain
            self.static = None
            del self.tokenizer, self._normalizer, self._word_ids
            log.info("student %s released", self.directory)
        if hasattr(self, "session"):
            del self.session, self.tokenizer, self._normalizer, self._word_ids
            return_freed_heap()
            log.info("student %s released", self.directory)

    def query_key(self, text: str) -> str:
        """`text` as this student's tokenizer sees it before splitting it into tokens (its normalizer, e.g. lower
        case, and runs of whitespace as one space where the pre-tokenizer splits on whitespace): two texts with
        the same key get the same tokens, hence the same vector (service.core.query_cache)."""
        if self._normalizer is not None:
            text = self._normalizer.normalize_str(text)
        return " ".join(text.split()) if self._collapse_spaces else text

    @property
    def teacher(self) -> TeacherRef:
        return self.manifest.teacher

    @property
    def dim(self) -> int:
        return self.manifest.teacher.dim

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """float32 [len(texts), dim] unit vectors in the teacher's space."""
        return self.encode_counted(texts, batch_size)[0]

    def encode_counted(self, texts: Sequence[str], batch_size: int = 64) -> tuple[np.ndarray, list[int]]:
        """`encode`, plus the tokens each text was encoded with (after truncation, special tokens included):
        /v1/embeddings reports them as usage without tokenizing twice."""
        if len(texts) == 1:
            return self._encode_one(texts[0])
        return self._encode_batches(texts, batch_size)

    def _encode_batches(self, texts: Sequence[str], batch_size: int) -> tuple[np.ndarray, list[int]]:
        """Calls of `batch_size` texts, each padded to its longest."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        tokens: list[int] = []
        observe, tokenizing = self.observe, 0.0
        for start in range(0, len(texts), batch_size):
            began = time.perf_counter()
            encodings = self.tokenizer.encode_batch(list(texts[start : start + batch_size]))
            tokenizing += time.perf_counter() - began
            if self.static is not None:
                static = self.static
                out[start : start + len(encodings)] = [static.encode(e.ids[: sum(e.attention_mask)]) for e in encodings]
                tokens.extend(int(sum(e.attention_mask)) for e in encodings)
                continue
            feed = {
                "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            }
            (emb,) = self.session.run(None, {k: v for k, v in feed.items() if k in self._inputs})
            out[start : start + len(encodings)] = emb
            tokens.extend(int(sum(e.attention_mask)) for e in encodings)
        if observe is not None:
            observe("tokenize", tokenizing)
        return out, tokens

    def _encode_one(self, text: str) -> tuple[np.ndarray, list[int]]:
        """One text, as `/search` encodes every query: no padding (the mask is all ones), no batch lists; what is
        left around the session is about 0.07 ms of a 2 ms encode (docs/lab/2026-11-26-encode-floor.md)."""
        began = time.perf_counter()
        row = self._word_ids.ids(text) if self._word_ids is not None else self.tokenizer.encode(text).ids
        if self.static is not None:
            if self.observe is not None:
                self.observe("tokenize", time.perf_counter() - began)
            return self.static.encode(row)[None, :], [len(row)]
        ids = np.array([row], dtype=np.int64)
        if self.observe is not None:
            self.observe("tokenize", time.perf_counter() - began)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)} if self._masked else {"input_ids": ids}
        (emb,) = self.session.run(None, feed)
        return emb, [ids.shape[1]]


def open_graph(path: Path, opts: ort.SessionOptions) -> ort.InferenceSession:
    """A session of the ONNX file at `path` with its SkipLayerNormalizations split (models.encoders.graph).

    A graph that needs no split (every student exported since the split) opens from its own path. One that does
    is written split to a private temporary file and opened from there, and the parsed graph is dropped before
    the session is used: a session built from the graph's bytes held about 20 MB more per process than one built
    from a file, and the parsed protobuf's freed heap is handed back to the OS (docs/lab/2026-11-26-encode-floor.md).
    """
    model = split_graph(path)
    if model is None:
        return_freed_heap()
        return _session(path, opts)
    with tempfile.TemporaryDirectory(prefix="tandem-graph-") as scratch:
        graph = Path(scratch) / path.name
        onnx.save(model, str(graph))
        del model
        session = _session(graph, opts)
    return_freed_heap()
    return session


def split_graph(path: Path) -> onnx.ModelProto | None:
    """The ONNX file at `path` with its SkipLayerNormalizations split, or None when it has none to split."""
    model = onnx.load(str(path))
    split = split_skip_layer_norms(model)
    if not split:
        return None
    log.info("%s: %d SkipLayerNormalization nodes split into Add + LayerNormalization", path.name, split)
    return model


def load_graph(path: Path) -> bytes:
    """The graph a session of `path` runs (`open_graph`), as bytes: what bench/encoding/encode_profile.py and the
    tests read."""
    model = split_graph(path)
    return path.read_bytes() if model is None else model.SerializeToString()


def session_options(threads: int) -> ort.SessionOptions:
    """A CPU session's options for a thread budget: `threads` for each op, one op at a time, every graph optimization.
    ORT reads neither OMP_NUM_THREADS nor torch's setting, and its own pool takes a thread per core whatever the
    budget (a pool given fewer cores than threads spins while it waits for them)."""
    import onnxruntime as ort  # here, not at the top: see _session

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return opts


def _session(path: Path, opts: ort.SessionOptions) -> ort.InferenceSession:
    """onnxruntime is imported where a session is made, not with this module: its import starts a thread of its
    own, and `tandem serve --processes N` forks its workers from a process that preloaded the service's modules and
    must hold no thread when it forks (service.runtime.workers)."""
    import onnxruntime as ort

    return ort.InferenceSession(
        str(path), sess_options=opts, providers=["CPUExecutionProvider"], disabled_optimizers=KEEP_SPLIT
    )
