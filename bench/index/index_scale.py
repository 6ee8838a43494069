"""Indexing at scale: peak memory of a build, the local engine against Ray, and the teacher's precisions.

Why: `tandem index build` used to hold the corpus and every full vector in RAM (15.2 GB at 1M
imported vectors); it now streams. This measures, in one run on this machine:
- peak RSS of `tandem index build` importing N synthetic unit vectors (flat binary), today's
  streaming build against the build of `--baseline` (a git revision, checked out into a
  temporary worktree), each in a fresh process measured by GNU time;
- docs/s of `--engine local` against `--engine ray` (a local Ray started by the build) on the same
  SciFact documents, end to end (model loading and Ray's start included), alternating runs;
- the CPU teacher in fp32 (the reference), bf16 and ONNX Runtime fp32: docs/s and cosine to fp32.
A GPU figure is only reported when one was measured (`--gpu-json`, written by the same script on
a GPU machine with `--precision-only --device cuda`).

    python -m bench.index.index_scale --rss-sizes 100000,1000000 --engine-docs 192 --precision-docs 64
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.harness.record import (
    REPO,
    cpu_flags,
    cpu_model,
    load_average,
    parse_with_output,
    publish,
    start_logging,
)
from bench.harness.runs import home_with_teacher, run_peak

log = logging.getLogger("bench.index_scale")

SECTION = "index-scale"
SCIFACT = Path(os.environ.get("TANDEM_SCIFACT_DIR", REPO.parent / "shared" / "data" / "scifact"))
WORDS = ("protein", "cell", "gene", "expression", "tumor", "patient", "clinical", "trial", "receptor", "signal",
         "pathway", "mouse", "model", "dose", "response", "risk", "cohort", "mutation", "immune", "virus",
         "infection", "therapy", "brain", "neuron")



def timed(cmd: list[str], home: Path, pythonpath: Path = REPO, extra_env: dict[str, str] | None = None,
          ) -> tuple[float, float]:
    """Run `cmd` (a Python command line) in a fresh process; returns (wall seconds, peak RSS in GiB)."""
    run = run_peak(cmd, home, cwd=pythonpath, env=extra_env, keep_stdout=False)
    return run.wall_s, run.peak_gib


def _run(args: list[str], home: Path, pythonpath: Path = REPO, extra_env: dict[str, str] | None = None,
         ) -> tuple[float, float]:
    """`python -m tandem ARGS`, timed."""
    return timed([sys.executable, "-m", "tandem", *args], home, pythonpath, extra_env)


def synthetic_import(directory: Path, n: int) -> tuple[Path, Path, Path]:
    """A corpus of n short texts, unit float16 vectors with a shared mean, and their ids."""
    rng = np.random.default_rng(0)
    corpus, vectors, ids = directory / "corpus.jsonl", directory / "vectors.npy", directory / "ids.json"
    with corpus.open("w") as fh:
        for i in range(n):
            text = " ".join(rng.choice(WORDS, size=12))
            fh.write(json.dumps({"_id": f"d{i}", "title": f"Doc {i}", "text": text}) + "\n")
    ids.write_text(json.dumps([f"d{i}" for i in range(n)]))
    mean = rng.standard_normal(768).astype(np.float32) * 0.5
    out = np.lib.format.open_memmap(vectors, mode="w+", dtype=np.float16, shape=(n, 768))
    for start in range(0, n, 65536):
        x = rng.standard_normal((min(65536, n - start), 768)).astype(np.float32) + mean
        out[start : start + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    del out
    return corpus, vectors, ids


@dataclass
class RssRow:
    n: int
    ours_gb: float
    ours_s: float
    base_gb: float | None
    base_s: float | None
    update_gb: float
    update_s: float


def measure_rss(sizes: list[int], baseline: Path | None, work: Path) -> list[RssRow]:
    rows = []
    for n in sizes:
        directory = work / f"rss-{n}"
        directory.mkdir()
        corpus, vectors, ids = synthetic_import(directory, n)
        args = ["index", "build", "--corpus", str(corpus), "--embeddings", str(vectors), "--ids", str(ids),
                "--quantization", "binary", "--dim", "768", "--index", "flat"]
        ours_s, ours_gb = _run([*args, "--out", str(directory / "ours")], home_with_teacher(directory / "home-ours"))
        _run(["index", "verify", str(directory / "ours")], directory / "home-ours")
        deletes = directory / "deletes.txt"
        deletes.write_text("".join(f"d{i}\n" for i in range(0, n, n // 100)))
        update_s, update_gb = _run(["index", "update", "--base", str(directory / "ours"), "--out",
                                    str(directory / "updated"), "--delete-ids", str(deletes)],
                                   directory / "home-ours")
        base_s = base_gb = None
        if baseline is not None:
            base_s, base_gb = _run([*args, "--out", str(directory / "base")],
                                   home_with_teacher(directory / "home-base"), pythonpath=baseline)
        rows.append(RssRow(n, ours_gb, ours_s, base_gb, base_s, update_gb, update_s))
        log.info("rss %d docs: streaming %.2f GB in %.0fs; baseline %s GB", n, ours_gb, ours_s, base_gb)
        for name in ("vectors.npy", "ours", "base", "updated", "home-ours", "home-base"):
            subprocess.run(["rm", "-rf", str(directory / name)], check=True)
    return rows


def scifact_corpus(path: Path, n: int) -> Path:
    with (SCIFACT / "corpus.jsonl").open() as src, path.open("w") as out:
        for _, line in zip(range(n), src, strict=False):
            out.write(line)
    return path


def measure_engines(n: int, rounds: int, work: Path) -> dict[str, list[float]]:
    corpus = scifact_corpus(work / "engines.jsonl", n)
    rates: dict[str, list[float]] = {"local": [], "ray": []}
    for r in range(rounds):
        for engine in ("local", "ray") if r % 2 == 0 else ("ray", "local"):
            home = home_with_teacher(work / f"home-{engine}-{r}")
            wall, _ = _run(["index", "build", "--corpus", str(corpus), "--out", str(work / f"b-{engine}-{r}"),
                            "--engine", engine], home)
            rates[engine].append(n / wall)
            log.info("engine %s round %d: %.2f docs/s (%.0fs)", engine, r, n / wall, wall)
    return rates


def onnx_teacher(model_dir: Path, directory: Path, threads: int) -> Callable[[list[str]], np.ndarray]:
    """The teacher exported to ONNX fp32 (mean pooling in numpy) for a side-by-side measurement."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    path = directory / "teacher.onnx"
    sample = tokenizer(["a sample text"], return_tensors="pt")
    torch.onnx.export(model, (sample["input_ids"], sample["attention_mask"]), str(path),
                      input_names=["input_ids", "attention_mask"], output_names=["hidden"], opset_version=17,
                      dynamic_axes={"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"},
                                    "hidden": {0: "b", 1: "t"}}, dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def encode(texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = np.empty((len(texts), 768), dtype=np.float32)
        lengths = [len(t) for t in tokenizer(texts, truncation=True, max_length=384)["input_ids"]]
        order = np.argsort(lengths)[::-1]
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=384,
                              return_tensors="np")
            hidden = session.run(None, {"input_ids": batch["input_ids"].astype(np.int64),
                                        "attention_mask": batch["attention_mask"].astype(np.int64)})[0]
            mask = batch["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            out[idx] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out

    return encode


def measure_precisions(n: int, device: str, rounds: int, work: Path) -> list[tuple[str, float, float, float]]:
    """(name, docs/s, mean cosine to fp32, min cosine to fp32) for each way of running the teacher.

    The variants take turns for `rounds` rounds and each keeps its best round, so a neighbour's load
    that comes and goes does not land on one variant alone.
    """
    import torch

    from models.corpus import read_corpus
    from models.encoders import registry
    from models.encoders.teacher import TeacherEncoder

    texts = [d.passage() for d in read_corpus(scifact_corpus(work / "precision.jsonl", n))]
    model_dir = registry.resolve("teacher")
    encoders: dict[str, Callable[[list[str]], np.ndarray]] = {}
    if device == "cuda":
        for name, precision, budget in (("fp32", "fp32", None), ("fp16", "fp16", 16384)):
            teacher = TeacherEncoder(model_dir, device="cuda", precision=precision, batch_tokens=budget)
            encoders[name] = functools.partial(teacher.encode_documents, batch_size=32)
    else:
        for name in ("fp32", "bf16"):
            teacher = TeacherEncoder(model_dir, device="cpu", precision=name)
            encoders[name] = functools.partial(teacher.encode_documents, batch_size=32)
        encoders["onnxruntime fp32"] = onnx_teacher(model_dir, work, torch.get_num_threads())
    best: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    for r in range(rounds):
        for name, encode in encoders.items() if r % 2 == 0 else reversed(encoders.items()):
            encode(texts[:4])  # warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            vectors[name] = encode(texts)
            if device == "cuda":
                torch.cuda.synchronize()
            rate = n / (time.perf_counter() - began)
            best[name] = max(best.get(name, 0.0), rate)
            log.info("teacher %s round %d: %.2f docs/s", name, r, rate)
    rows = []
    for name in encoders:
        cos = (vectors[name] * vectors["fp32"]).sum(axis=1)
        rows.append((name, best[name], float(cos.mean()), float(cos.min())))
        log.info("teacher %s: best %.2f docs/s, cosine to fp32 mean %.6f min %.6f", name, best[name], cos.mean(),
                 cos.min())
    return rows


def render(args: argparse.Namespace, rss: list[RssRow], rates: dict[str, list[float]],
           precisions: list[tuple[str, float, float, float]], gpu: list[tuple[str, float, float, float]] | None,
           load: str) -> str:
    lines = ["# Indexing at scale: memory, the Ray engine, the teacher's precisions", "",
             f"`python -m bench.index.index_scale {shlex.join(args.argv)}` on {cpu_model()} ({os.cpu_count()} cores; "
             f"flags: {cpu_flags()}), {datetime.now(UTC):%Y-%m-%d}, load before the run {load}.", ""]
    if rss:
        lines += ["**Peak RSS of `tandem index build`** importing synthetic unit vectors (flat binary, 768-d; "
                  "GNU time's maximum resident set size of the build process), the streaming build against the "
                  "build before it "
                  f"(`{args.baseline}`):", "",
                  "| documents | streaming: peak RSS | streaming: wall | before: peak RSS | before: wall | "
                  "`index update` (100 deletes): peak RSS | wall |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rss:
            base = (f"{r.base_gb:.2f} GB", f"{r.base_s:.0f} s") if r.base_gb is not None and r.base_s else ("—", "—")
            lines.append(f"| {r.n:,} | {r.ours_gb:.2f} GB | {r.ours_s:.0f} s | {base[0]} | {base[1]} | "
                         f"{r.update_gb:.2f} GB | {r.update_s:.0f} s |")
        lines.append("")
    if rates["local"]:
        local, ray = np.median(rates["local"]), np.median(rates["ray"])
        lines += [f"**Local engine against Ray** on the first {args.engine_docs} SciFact documents, end to end "
                  "(`tandem index build`, model loading and Ray's start included; a local Ray started by the build, "
                  f"2 CPU actors of 1 torch thread against one process of {os.cpu_count()} threads), "
                  f"{args.rounds} alternating rounds each:", "",
                  "| engine | docs/s per round | median |", "|---|---|---:|",
                  f"| local | {', '.join(f'{x:.2f}' for x in rates['local'])} | {local:.2f} |",
                  f"| ray | {', '.join(f'{x:.2f}' for x in rates['ray'])} | {ray:.2f} |", "",
                  f"Ray / local: **{ray / local:.2f}×**.", ""]
    if precisions:
        lines += [f"**The teacher on this CPU**, {args.precision_docs} SciFact documents, batches of 32, "
                  f"{os.cpu_count()} threads, the best of {args.rounds} alternating rounds each:", "",
                  "| teacher | docs/s | × fp32 | cosine to fp32 (mean / min) |",
                  "|---|---:|---:|---|"]
        fp32_rate = precisions[0][1]
        for name, rate, mean, low in precisions:
            lines.append(f"| {name} | {rate:.2f} | {rate / fp32_rate:.2f} | {mean:.6f} / {low:.6f} |")
        lines.append("")
    if gpu:
        lines += ["**The teacher on a GPU** (`--gpu-json`):", "", "| teacher | docs/s | cosine to fp32 |",
                  "|---|---:|---|"]
        lines += [f"| {name} | {rate:.1f} | {mean:.6f} |" for name, rate, mean, _ in gpu]
    else:
        lines.append("**GPU:** no GPU was lent to this run, so the teacher's fp16 docs/s on CUDA and its cosine to "
                     "CPU fp32 were not measured.")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Peak RSS of builds, local vs Ray docs/s, teacher precisions.")
    parser.add_argument("--rss-sizes", default="100000,1000000", help="Comma-separated document counts ('' skips).")
    parser.add_argument("--baseline", default="899b015", help="Git revision of the build to compare ('' skips).")
    parser.add_argument("--engine-docs", type=int, default=192, help="SciFact documents per engine run (0 skips).")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision-docs", type=int, default=64, help="SciFact documents per precision (0 skips).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision-only", action="store_true", help="Only the precision table, as JSON to stdout.")
    parser.add_argument("--gpu-json", type=Path, help="A GPU machine's --precision-only output to include.")
    return parse_with_output(parser, argv)


def main(argv: Sequence[str] | None = None) -> None:
    start_logging()
    args = parse_args(argv)
    _, load = load_average()
    with tempfile.TemporaryDirectory(prefix="index-scale-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        if args.precision_only:
            print(json.dumps(measure_precisions(args.precision_docs, args.device, args.rounds, work)))
            return
        precisions = measure_precisions(args.precision_docs, args.device, args.rounds, work) \
            if args.precision_docs else []
        rates = measure_engines(args.engine_docs, args.rounds, work) if args.engine_docs else {"local": [], "ray": []}
        baseline = None
        if args.baseline:
            baseline = work / "baseline"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(baseline),
                            args.baseline], check=True)
        try:
            sizes = [int(s) for s in args.rss_sizes.split(",") if s]
            rss = measure_rss(sizes, baseline, work)
        finally:
            if baseline is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], check=True)
    gpu = json.loads(args.gpu_json.read_text()) if args.gpu_json else None
    publish(args.lab, SECTION, render(args, rss, rates, precisions, gpu, load), write=not args.no_write)


if __name__ == "__main__":
    main()
