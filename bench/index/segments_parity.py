"""Segments parity on SciFact (issue 37): a base and three updates against a fresh build of the same documents.

The base holds SciFact's corpus less 5% of its documents, with 2% of the others' texts cut in half (drafts),
plus 50 junk documents; its vectors are imported (SciFact's reference teacher vectors, random ones for the
junk), since the teacher takes an hour for the corpus on this CPU. Three updates (`tandem index update`, the
teacher encoding what they add, about 360 texts) then add the first half of the missing documents; restore the
drafts' texts and delete half the junk; add the other half and delete the rest of the junk. The segmented
version (four segments, with tombstones) holds exactly SciFact's corpus. The fresh build is `tandem index
build` of those same documents with the same teacher vectors (exported from the segmented version by
`tandem index export`, imported with `--embeddings`).

Compared on SciFact's test queries: the dense top-10 of every query (flat float index, 768-d), with the
teacher's query vectors and the student's; and `tandem eval` on both (nDCG@10 of every row, lexical and hybrid
included). Which documents are held out, drafted or junk is drawn with a fixed seed from the corpus alone.

    python -m bench.index.segments_parity --data ../shared/data/scifact --student .tandem/students/scifact-quick
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.harness.record import REPO, add_output_args, command_line, cpu_line, load_average, publish, start_logging
from bench.index.index_scale import WORDS

log = logging.getLogger("bench.segments_parity")

SECTION = "segments-parity"


def tandem(*args: str) -> None:
    cmd = [sys.executable, "-m", "tandem", *args]
    log.info("run: %s", shlex.join(cmd))
    subprocess.run(cmd, cwd=REPO, check=True)


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


def prepare(data: Path, work: Path) -> tuple[Path, list[Path]]:
    """The base corpus (with its vectors.npy and ids.json beside it) and the three change files."""
    from models.corpus import Document, read_corpus

    docs = read_corpus(data / "corpus.jsonl")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(docs))
    held = [docs[i] for i in order[: len(docs) // 20]]
    drafted = {docs[i].id for i in order[len(docs) // 20 : len(docs) // 20 + len(docs) // 50]}
    junk = [{"_id": f"junk-{i}", "title": "", "text": " ".join(rng.choice(WORDS, size=20))} for i in range(50)]
    held_ids = {d.id for d in held}

    def line(doc: Document, text: str | None = None) -> dict:
        return {"_id": doc.id, "title": doc.title, "text": doc.text if text is None else text}

    base = [line(d, d.text[: max(1, len(d.text) // 2)] if d.id in drafted else None)
            for d in docs if d.id not in held_ids] + junk
    reference = np.load(data / "reference" / "all-mpnet-base-v2.corpus.f16.npy")
    ids = json.loads((data / "reference" / "all-mpnet-base-v2.corpus.ids.json").read_text())
    row = {i: r for r, i in enumerate(ids)}
    noise = rng.standard_normal((len(junk), reference.shape[1])).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    kept = [d.id for d in docs if d.id not in held_ids]
    np.save(work / "vectors.npy", np.concatenate([reference[[row[i] for i in kept]].astype(np.float32), noise]))
    (work / "ids.json").write_text(json.dumps(kept + [j["_id"] for j in junk]))
    half = len(held) // 2
    changes = [
        write(work / "u1.jsonl", [line(d) for d in held[:half]]),
        write(work / "u2.jsonl", [line(d) for d in docs if d.id in drafted]
              + [{"_id": j["_id"], "delete": True} for j in junk[:25]]),
        write(work / "u3.jsonl", [line(d) for d in held[half:]]
              + [{"_id": j["_id"], "delete": True} for j in junk[25:]]),
    ]
    return write(work / "base.jsonl", base), changes


def top10(bundle_dir: Path, vectors: np.ndarray) -> list[list[str]]:
    from models.bundle.version import Bundle
    from models.search import dense_hits

    bundle = Bundle(bundle_dir)
    try:
        return [[h.doc.id for h in hits] for hits in dense_hits(bundle, vectors, 10)]
    finally:
        bundle.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tandem-bench-segments-parity"))
    add_output_args(parser)
    args = parser.parse_args(argv)
    start_logging()
    load = load_average()[1]
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    base, changes = prepare(args.data, args.work)
    root, fresh = args.work / "root", args.work / "fresh"
    tandem("index", "build", "--corpus", str(base), "--embeddings", str(args.work / "vectors.npy"), "--ids",
           str(args.work / "ids.json"), "--root", str(root), "--version", "v1")
    for i, change in enumerate(changes, start=2):
        tandem("index", "update", "--root", str(root), "--changes", str(change), "--version", f"v{i}")
    segmented = root / "v4"
    export = args.work / "final.parquet"
    tandem("index", "export", str(segmented), "--out", str(export), "--format", "parquet")
    tandem("index", "export", str(segmented), "--out", str(args.work / "final.jsonl"), "--format", "jsonl")
    tandem("index", "build", "--corpus", str(args.work / "final.jsonl"), "--embeddings", str(export),
           "--out", str(fresh))

    from models.bundle.version import read_bundle_manifest
    from models.datasets.beir import load_beir
    from models.encoders.registry import resolve
    from models.encoders.student import StudentEncoder
    from models.encoders.teacher import TeacherEncoder

    manifest = read_bundle_manifest(segmented)
    queries = list(load_beir(args.data, "test").queries.values())
    teacher_q = TeacherEncoder(resolve("teacher")).encode_queries(queries)
    student_q = StudentEncoder(args.student).encode(queries, batch_size=1)
    same = {}
    for name, vectors in (("teacher", teacher_q), ("student", student_q)):
        a, b = top10(segmented, vectors), top10(fresh, vectors)
        same[name] = sum(x == y for x, y in zip(a, b, strict=True))
    reports = {}
    for name, bundle in (("segmented", segmented), ("fresh", fresh)):
        out = args.work / f"eval-{name}.json"
        tandem("eval", "--data", str(args.data), "--index", str(bundle), "--student", str(args.student), "--split",
               "test", "--json", str(out))
        reports[name] = json.loads(out.read_text())
    rows = [k for k in reports["fresh"] if isinstance(reports["fresh"][k], dict) and "ndcg@10" in reports["fresh"][k]]
    command = command_line(argv)
    lines = [f"# Segments parity on SciFact ({datetime.now(UTC):%Y-%m-%d})", "",
             f"- Command: `{command}`", f"- CPU: {cpu_line()}", f"- Load average before: {load}",
             f"- Segmented: {len(manifest.parts)} segments, "
             f"{sum(s.deleted for s in manifest.parts)} deleted rows, {manifest.count} live documents; fresh: "
             "one segment of the same documents and vectors. Flat float, 768-d.", "",
             f"Dense top-10 identical, {len(queries)} test queries: teacher queries {same['teacher']}, "
             f"student queries {same['student']}.", "",
             "| row | nDCG@10 segmented | nDCG@10 fresh | difference |", "|---|---:|---:|---:|"]
    for row in rows:
        x, y = reports["segmented"][row]["ndcg@10"], reports["fresh"][row]["ndcg@10"]
        lines.append(f"| {row} | {x:.4f} | {y:.4f} | {x - y:+.4f} |")
    publish(args.lab, SECTION, "\n".join(lines) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
