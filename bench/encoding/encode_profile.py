"""Where one query's encode goes: onnxruntime's profiler per operator, the stages around the session, and the
served student against the plain way, one query per call, one thread, alternating in one run.

Why: the encode is most of a query's cost, and only a profile says which part of it is worth cutting. Three
encoders run side by side on the same queries, block by block (encode_latency.measure):

- served: `StudentEncoder`, as `tandem serve` loads it (its graph as models.encoders.student.load_graph runs it);
- stored: the same student's int8 file run as stored, through the batch path (what the served encode was before
  the split and the one-query path);
- plain: what a new user gets: the backbone (all-MiniLM-L6-v2) exported by torch, `quantize_dynamic` with its
  defaults, the backbone's tokenizer without padding, mean pooling and normalization in numpy.

Then each graph runs under onnxruntime's profiler (per operator type: time per query, node count, provider; the
pooling, head and normalization after the last layer norm apart), the served encode's stages are timed one by one
(tokenize, inputs, session, Python around), and, with --index, the served and stored int8 vectors are compared:
cosine to the fp32 graph (the export's parity gate) and SciFact asymmetric nDCG@10 (queries alone, as served).
`--also DIR` (repeatable) times more students, served as `tandem serve` loads them, in the same blocks (say, a
shallower student against the 6-layer one and the plain way), and with --index scores each as served and in fp32;
the profile stays --student's.

    python -m bench.encoding.encode_profile --student DIR --index BUNDLE [--also DIR ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np

from bench.encoding.encode_latency import DEFAULT_SCIFACT, load_queries, measure
from bench.harness.record import (
    command_line,
    load_average,
    machine,
    parse_with_output,
    publish,
    start_logging,
)
from models.encoders.student import session_options as student_session_options

log = logging.getLogger("bench.encode_profile")

SECTION = "encode-profile"
NORMS = ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization", "QEmbedLayerNormalization")


def session_options(profile_prefix: str | None = None) -> object:
    """One thread, as the served student's sessions are given (models.encoders.student), profiled when asked."""
    opts = student_session_options(1)
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return opts


def export_plain(backbone: Path, out: Path) -> Path:
    """The backbone as a new user exports it: AutoModel, torch's classic exporter, `quantize_dynamic` defaults."""
    import torch
    from onnxruntime.quantization import quantize_dynamic
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(backbone)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 2003, 102]])
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(), (ids, torch.ones_like(ids)), str(out / "plain.onnx"),
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
                          opset_version=17, dynamo=False)
    root = logging.getLogger()  # the quantizer logs lines per tensor on the root logger
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        quantize_dynamic(out / "plain.onnx", out / "plain.int8.onnx")
    finally:
        root.setLevel(level)
    return out / "plain.int8.onnx"


class Plain:
    """The plain way's encode: tokenizer without padding, the session, mean pooling and normalization in numpy."""

    def __init__(self, graph: Path | bytes, tokenizer: Path, max_length: int, profile: str | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        source = str(graph) if isinstance(graph, Path) else graph
        self.session = ort.InferenceSession(source, session_options(profile), providers=["CPUExecutionProvider"])
        self.names = {i.name for i in self.session.get_inputs()}

    def feed(self, text: str) -> dict[str, np.ndarray]:
        e = self.tokenizer.encode(text)
        feed = {"input_ids": np.array([e.ids], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask], dtype=np.int64)}
        return {k: v for k, v in feed.items() if k in self.names}

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            feed = self.feed(text)
            (hidden,) = self.session.run(None, feed)
            mask = feed["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
            rows.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        return np.concatenate(rows)


def profile(run: Callable[[str], object], end: Callable[[], str], queries: Sequence[str]) -> dict[str, object]:
    """Run every query once under the profiler; per operator type µs per query and nodes, and the tail after the
    last layer norm (pooling, head, normalization) apart."""
    for text in queries:
        run(text)
    events = json.loads(Path(end()).read_text())
    per_op: dict[str, float] = defaultdict(float)
    nodes: dict[str, set[str]] = defaultdict(set)
    providers: dict[str, set[str]] = defaultdict(set)
    ordered: list[list[tuple[str, float]]] = [[]]  # each run's nodes: a model_run event closes after its nodes
    model_us = 0.0
    for event in events:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            model_us += event["dur"]
            ordered.append([])
        elif event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            per_op[op] += event["dur"]
            nodes[op].add(event["name"])
            providers[op].add(event["args"].get("provider", "?"))
            ordered[-1].append((op, event["dur"]))
    tails = []
    for nodes_of_run in ordered[:-1]:
        last_norm = max((i for i, (op, _) in enumerate(nodes_of_run) if op in NORMS), default=-1)
        tails.append(sum(d for _, d in nodes_of_run[last_norm + 1:]))
    n = len(queries)
    return {
        "model_run_us": model_us / n,
        "nodes_us": sum(per_op.values()) / n,
        "tail_us": statistics.fmean(tails) if tails else 0.0,
        "ops": sorted(((op, us / n, len(nodes[op]), ",".join(sorted(providers[op]))) for op, us in per_op.items()),
                      key=lambda row: -row[1]),
    }


def plain_run(plain: Plain, text: str) -> object:
    return plain.session.run(None, plain.feed(text))


def stages(encoder: object, queries: Sequence[str], rounds: int = 3) -> dict[str, float]:
    """The served one-query encode cut into its steps, each timed alone (µs per query, median of rounds)."""
    tok = encoder.tokenizer  # type: ignore[attr-defined]
    session = encoder.session  # type: ignore[attr-defined]
    out: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        t: dict[str, float] = defaultdict(float)
        for text in queries:
            a = time.perf_counter()
            ids = tok.encode(text).ids
            b = time.perf_counter()
            arr = np.array([ids], dtype=np.int64)
            feed = {"input_ids": arr, "attention_mask": np.ones_like(arr)}
            c = time.perf_counter()
            session.run(None, feed)
            d = time.perf_counter()
            encoder.encode([text])  # type: ignore[attr-defined]
            e = time.perf_counter()
            t["tokenize"] += b - a
            t["inputs (numpy arrays)"] += c - b
            t["session.run"] += d - c
            t["whole encode() call"] += e - d
        for k, v in t.items():
            out[k].append(v / len(queries) * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--also", type=Path, action="append", default=[],
                        help="another student timed served in the same blocks (repeatable)")
    parser.add_argument("--backbone", type=Path, default=None, help="plain way's model (default: provisioned)")
    parser.add_argument("--queries", type=Path, default=Path(os.environ.get("TANDEM_SCIFACT_DIR", DEFAULT_SCIFACT)))
    parser.add_argument("--index", type=Path, default=None, help="bundle of the queries' corpus: nDCG@10 too")
    parser.add_argument("-n", "--num-queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--passes", type=int, default=4, help="times each encoder times every query")
    parser.add_argument("--profile-queries", type=int, default=200)
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    start_logging()
    import onnxruntime as ort

    from models.encoders.registry import resolve
    from models.encoders.student import KEEP_SPLIT, StudentEncoder, load_graph

    queries, described = load_queries(args.queries, args.num_queries)
    backbone = resolve("backbone", args.backbone)
    served = StudentEncoder(args.student, "int8", threads=1)
    stored_file = served.directory / served.manifest.onnx_int8
    stored = StudentEncoder(args.student, "int8", threads=1)
    stored.session = ort.InferenceSession(str(stored_file), session_options(), providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory() as tmp:
        plain_file = export_plain(backbone, Path(tmp))
        plain = Plain(plain_file, backbone / "tokenizer.json", served.manifest.max_seq_length)
        encoders: dict[str, Callable[[list[str]], object]] = {
            "served student (int8, graph as loaded, one-query path)": served.encode,
            "stored student graph, batch path (before)": lambda t: stored._encode_batches(t, 64),
            "plain: all-MiniLM-L6-v2, torch export, quantize_dynamic defaults": plain.encode,
        }
        for other in args.also:
            extra = StudentEncoder(other, "int8", threads=1)
            encoders[f"served student `{other}`"] = extra.encode
        _, load_before = load_average()
        results = measure(encoders, queries * args.passes, args.warmup, args.rounds, 1)
        load_after = load_average()[1]
        p50 = {r.name: r.p50 for r in results}
        mean = {r.name: r.mean for r in results}

        prof_queries = queries[: args.profile_queries]
        profiles = {}
        for name, graph, kind in (("served", load_graph(stored_file), "student"),
                                  ("stored", stored_file, "student"), ("plain", plain_file, "plain")):
            prefix = str(Path(tmp) / f"profile-{name}")
            if kind == "student":
                source = graph if isinstance(graph, bytes) else str(graph)
                session = ort.InferenceSession(source, session_options(prefix), providers=["CPUExecutionProvider"],
                                               disabled_optimizers=KEEP_SPLIT if name == "served" else [])

                def run(text: str, session: ort.InferenceSession = session, tok: object = served.tokenizer) -> object:
                    ids = np.array([tok.encode(text).ids], dtype=np.int64)  # type: ignore[attr-defined]
                    return session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})

                profiles[name] = profile(run, session.end_profiling, prof_queries)
            else:
                p = Plain(plain_file, backbone / "tokenizer.json", served.manifest.max_seq_length, prefix)
                profiles[name] = profile(partial(plain_run, p), p.session.end_profiling, prof_queries)
        steps = stages(served, prof_queries)
    tokens = statistics.fmean(len(served.tokenizer.encode(q).ids) for q in queries)

    quality: list[str] = []
    if args.index is not None:
        quality = parity_and_ndcg(args, served, stored)

    names = list(encoders)
    plain_name = names[2]
    rows = [
        "| encoder (one query per call, 1 thread) | p50 ms | mean ms | p50 ÷ plain |",
        "|---|---:|---:|---:|",
        *(f"| {n} | {p50[n]:.3f} | {mean[n]:.3f} | {p50[n] / p50[plain_name]:.2f} |" for n in names),
    ]
    prof_rows = []
    for name, prof in profiles.items():
        prof_rows += [
            "", f"**{name}** graph: model_run {prof['model_run_us']:.0f} µs/query under the profiler, nodes "
            f"{prof['nodes_us']:.0f} µs, after the last layer norm (pooling, head, normalize) {prof['tail_us']:.0f} µs",
            "", "| operator | µs per query | nodes | provider |", "|---|---:|---:|---|",
            *(f"| {op} | {us:.1f} | {n} | {prov} |" for op, us, n, prov in prof["ops"]),  # type: ignore[attr-defined]
        ]
    step_rows = ["| stage of the served encode | µs per query |", "|---|---:|",
                 *(f"| {k} | {v:.1f} |" for k, v in steps.items())]
    command = command_line()
    section = "\n".join([
        "# Where one query's encode goes (onnxruntime profile, stages, against the plain way)",
        "",
        f"Command: `{command}`",
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}; onnxruntime {ort.__version__}; load average "
        f"{load_before} before, {load_after} after",
        f"- Setup: student `{args.student}`; queries: {described}, {tokens:.1f} tokens on average; one query per "
        f"call, 1 intra-op thread; {args.warmup} warm-up calls each, then every query {args.passes} times in "
        f"{args.rounds} rounds of blocks, encoders taking turns block by block "
        f"(bench/encoding/encode_latency.py `measure`). Profiles: {len(prof_queries)} queries "
        "per graph, onnxruntime's profiler (its own overhead included); stages: each step timed alone, median of 3.",
        "",
        *rows,
        "",
        *step_rows,
        *prof_rows,
        *(["", *quality] if quality else []),
    ])
    publish(args.lab, SECTION, section, write=not args.no_write)


def parity_and_ndcg(args: argparse.Namespace, served: object, stored: object) -> list[str]:
    """Cosine of each int8 graph to the fp32 graph (as the service loads it), and nDCG@10 of every graph, fp32 and
    int8, as loaded and as stored, queries alone, on each split with qrels (test, and train where present: more
    queries, less noise; none of them chose anything here)."""
    import onnxruntime as ort

    from models.bundle.version import Bundle
    from models.datasets.beir import QRELS_DIR, QUERIES_FILE, read_qrels, read_queries
    from models.encoders.student import StudentEncoder
    from models.evaluation.metrics import NDCG, score_run
    from models.evaluation.run import bundle_search_run

    all_queries = read_queries(args.queries / QUERIES_FILE)
    fp32 = StudentEncoder(args.student, "fp32", threads=1)
    fp32_stored = StudentEncoder(args.student, "fp32", threads=1)
    fp32_stored.session = ort.InferenceSession(str(fp32.directory / fp32.manifest.onnx_fp32), session_options(),
                                               providers=["CPUExecutionProvider"])
    encoders: dict[str, Callable[[list[str]], np.ndarray]] = {
        "fp32, as loaded (split)": fp32.encode,
        "fp32, as stored": lambda t: fp32_stored._encode_batches(t, 64)[0],
        "int8, as loaded (split), served": served.encode,  # type: ignore[attr-defined]
        "int8, as stored (before)": lambda t: stored._encode_batches(t, 64)[0],  # type: ignore[attr-defined]
    }
    others = {other: (StudentEncoder(other, "fp32", threads=1).encode, StudentEncoder(other, "int8", threads=1).encode)
              for other in args.also}
    bundle = Bundle(args.index)
    lines: list[str] = []
    try:
        for split in ("test", "train"):
            path = args.queries / QRELS_DIR / f"{split}.tsv"
            if not path.is_file():
                continue
            qrels, _ = read_qrels(path)
            qids = [q for q in qrels if q in all_queries]
            texts = [all_queries[q] for q in qids]
            vectors = {name: np.concatenate([encode([t]) for t in texts]) for name, encode in encoders.items()}
            other_rows = []
            for other, (other_fp32, other_int8) in others.items():
                own = np.concatenate([other_fp32([t]) for t in texts])
                for name, v in ((f"`{other}` fp32", own),
                                (f"`{other}` int8 served", np.concatenate([other_int8([t]) for t in texts]))):
                    cos = np.sum(v * own, axis=1)
                    ndcg = score_run(qrels, bundle_search_run(bundle, qids, v))[NDCG]
                    other_rows.append(f"| {name} | {cos.mean():.5f} (own fp32) | {cos.min():.4f} | | {ndcg:.4f} |")
            reference = vectors["fp32, as loaded (split)"]
            before = vectors["int8, as stored (before)"]
            lines += ["", f"{split}: {len(texts)} queries with qrels, each encoded alone; bundle `{args.index}`", "",
                      "| graph | mean cosine to fp32 (as loaded) | min | mean cosine to int8 as stored | nDCG@10 |",
                      "|---|---:|---:|---:|---:|"]
            for name, v in vectors.items():
                cos = np.sum(v * reference, axis=1)
                ndcg = score_run(qrels, bundle_search_run(bundle, qids, v))[NDCG]
                lines.append(f"| {name} | {cos.mean():.5f} | {cos.min():.4f} | {np.sum(v * before, axis=1).mean():.5f} "
                             f"| {ndcg:.4f} |")
            lines += other_rows
    finally:
        bundle.close()
    return ["Quality (SciFact):", *lines]


if __name__ == "__main__":
    main()
