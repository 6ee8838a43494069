"""Issue 57's acceptance matrix: sharded answers on a local Ray cluster of one-CPU nodes against the single box.

Versions (built here once, into --work, by `tandem index build` importing vectors: no teacher runs):
- SciFact (the corpus by path, the reference teacher vectors) as a base plus three updates, each moving ~6% of
  the documents to another `bucket` (a metadata-only change: the vector is kept, the row moves to the update's
  segment) and deleting 40: four segments, tombstones in the first three.
- a synthetic corpus (`--size`, default 100,000; vectors around SciFact's reference ones as bench/index/index_types.py
  makes them, texts SciFact's cycled with the row's number appended) built with `--segment-rows size/4` in flat int8,
  flat binary, HNSW int8, HNSW binary and IVF binary.

Every document has `bucket` = crc32(id) mod 100, so `{"bucket": 7}` keeps about 1% and `bucket < 30` about 30%.
Queries: SciFact's 300 test queries' texts (lexical), and for the dense side the reference vector of a seeded
random document plus noise (a query near real documents, as a student's is); no query is used to choose anything.

For each version and plan (1 shard; 2 by rows; 2 uneven: the first segment alone; 4: one segment each), the shards
are deployed on Ray Serve with two replicas of the first shard (`ray.cluster_utils.Cluster`, `--nodes` nodes of one
CPU each), and every (mode × filter × offset) runs the queries in batches of `--batch` through both the coordinator
and the single box (models.search.search, what `tandem serve` runs): ids, rows, float32 scores and the version
are compared, each mismatch counted. Prints JSON.

    python -m bench.cluster.shard_acceptance --work /tmp/shard-acceptance --data ../shared/data/scifact \
        --out report.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_model
from bench.index.index_types import synthesize
from models.bundle.version import Bundle
from models.search import Mode, SearchOptions, parse_filter, search
from models.search.shards import plan_shards

log = logging.getLogger("bench.shard_acceptance")
OVERSAMPLE = 4
REFERENCE = "reference/all-mpnet-base-v2.corpus.f16.npy"
REFERENCE_IDS = "reference/all-mpnet-base-v2.corpus.ids.json"


def bucket(doc_id: str) -> int:
    return zlib.crc32(doc_id.encode()) % 100


def _tandem(*args: str) -> None:
    """One `tandem` command in this interpreter (no sample: it would run the teacher, which the imports avoid)."""
    from typer.testing import CliRunner

    from tandem.cli import app

    done = CliRunner().invoke(app, list(args), catch_exceptions=False)
    if done.exit_code:
        raise SystemExit(f"tandem {' '.join(args)} failed ({done.exit_code}): {done.output}")


def _write(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def scifact_root(data: Path, work: Path) -> Path:
    """A root whose current version is SciFact plus three updates (four segments, tombstones in three)."""
    root = work / "scifact-root"
    if (root / "CURRENT").is_file():
        return root
    docs = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    for d in docs:
        d["bucket"] = bucket(d["_id"])
    corpus = _write(work / "scifact.jsonl", docs)
    _tandem("index", "build", "--corpus", str(corpus), "--root", str(root), "--version", "v1", "--metadata-extra",
            "--embeddings", str(data / REFERENCE), "--ids", str(data / REFERENCE_IDS))
    rng = random.Random(57)
    alive = [d["_id"] for d in docs]
    by_id = {d["_id"]: d for d in docs}
    for n in (2, 3, 4):
        rng.shuffle(alive)
        moved, deleted = alive[:300], alive[300:340]
        lines: list[dict[str, object]] = [{**by_id[i], "bucket": (by_id[i]["bucket"] + 1) % 100} for i in moved]
        lines += [{"_id": i, "delete": True} for i in deleted]
        for i in moved:
            by_id[i] = {**by_id[i], "bucket": (by_id[i]["bucket"] + 1) % 100}
        alive = alive[340:] + moved
        _tandem("index", "update", "--root", str(root), "--version", f"v{n}",
                "--changes", str(_write(work / f"scifact-u{n}.jsonl", lines)))
    return root


KINDS = ["flat-int8", "flat-binary", "hnsw-int8", "hnsw-binary", "ivf-binary"]


def synthetic_versions(data: Path, work: Path, size: int, kinds: list[str]) -> list[Path]:
    """The synthetic corpus in each index type and quantization (`kinds`), as four even segments."""
    inputs = work / f"synthetic-{size}"
    inputs.mkdir(parents=True, exist_ok=True)
    if not (inputs / "ids.json").is_file():
        vectors, _ = synthesize(data / REFERENCE, size, 1, seed=size)
        np.save(inputs / "vectors.f16.npy", vectors.astype(np.float16))
        texts = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
        ids = [f"doc{i}" for i in range(size)]
        _write(inputs / "corpus.jsonl", [{"_id": doc_id, "title": texts[i % len(texts)]["title"],
                                          "text": f"{texts[i % len(texts)]['text']} {i}", "bucket": bucket(doc_id)}
                                         for i, doc_id in enumerate(ids)])
        (inputs / "ids.json").write_text(json.dumps(ids))
    out = []
    for index, quantization in (kind.split("-") for kind in kinds):
        bundle = inputs / f"bundle-{index}-{quantization}"
        if not (bundle / "manifest.json").is_file():
            began = time.perf_counter()
            _tandem("index", "build", "--corpus", str(inputs / "corpus.jsonl"), "--out", str(bundle), "--force",
                    "--metadata-extra", "--embeddings", str(inputs / "vectors.f16.npy"), "--ids",
                    str(inputs / "ids.json"), "--index", index, "--quantization", quantization,
                    "--segment-rows", str(-(-size // 4)))
            log.info("built %s in %.0f s", bundle.name, time.perf_counter() - began)
        out.append(bundle)
    return out


def plans(counts: list[int]) -> dict[str, list[list[int]]]:
    n = len(counts)
    out = {"1": [list(range(n))]}
    if n >= 2:
        out["2"] = plan_shards(counts, 2)
        uneven = [[0], list(range(1, n))]  # the first segment alone, unless that is already the even plan
        out["2-uneven"] = uneven if uneven != out["2"] else [list(range(n - 1)), [n - 1]]
    if n >= 4:
        out["4"] = [[i] for i in range(n)]
    return out


def _answer(hits: list) -> list[list[tuple[str, int, float]]]:
    return [[(h.doc.id, h.row, h.score) for h in page] for page in hits]


def compare(version: Path, texts: list[str], vectors: np.ndarray, batch: int) -> dict[str, object]:
    """Every plan of `version` on Ray Serve against the single box; mismatches counted per plan."""
    from cluster.coordinator import ClusterSearch

    box = Bundle(version)
    out: dict[str, object] = {"documents": box.count, "segments": [s.count for s in box.manifest.parts],
                              "deleted": box.manifest.deleted, "index": box.manifest.index.type.value,
                              "quantization": box.manifest.quantization.value, "plans": {}}
    filters = {"none": None, "1%": parse_filter({"field": "bucket", "eq": 7}, box.filter_fields),
               "30%": parse_filter({"field": "bucket", "lt": 30}, box.filter_fields)}
    try:
        for name, plan in plans([s.count for s in box.manifest.parts]).items():
            replicas = [2] + [1] * (len(plan) - 1)
            sharded = ClusterSearch(len(plan), replicas, timeout_s=60.0, cpus_per_replica=0.25)
            began = time.perf_counter()
            sharded.deploy(version, plan)
            compared = mismatched = hits = 0
            cases: dict[str, int] = {}  # mismatches by mode/filter/offset, where any
            try:
                for mode in Mode:
                    for filter_name, flt in filters.items():
                        for offset in (0, 20):
                            opts = SearchOptions(top_k=10, mode=mode, offset=offset, filter=flt)
                            for start in range(0, len(texts), batch):
                                v, q = vectors[start : start + batch], texts[start : start + batch]
                                want = _answer(search(box, v, q, opts, OVERSAMPLE).hits)
                                served, got = sharded.search(v, q, opts, OVERSAMPLE)
                                for a, b in zip(_answer(got.hits), want, strict=True):
                                    compared += 1
                                    hits += len(b)
                                    if a != b or served != version.name:
                                        mismatched += 1
                                        case = f"{mode.value}/{filter_name}/{offset}"
                                        cases[case] = cases.get(case, 0) + 1
            finally:
                sharded.close()
            out["plans"][name] = {  # type: ignore[index]
                "plan": plan, "replicas": replicas, "answers": compared, "hits": hits, "mismatches": mismatched,
                "by_case": cases, "seconds": round(time.perf_counter() - began, 1)}
            log.info("%s %s: %d answers, %d mismatches", version, name, compared, mismatched)
    finally:
        box.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="the SciFact folder (corpus, queries, reference)")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=4, help="one-CPU nodes of the local Ray cluster")
    parser.add_argument("--batch", type=int, default=30)
    parser.add_argument("--only", choices=["scifact", "synthetic"])
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"synthetic index-quantization kinds, of {KINDS}")
    parser.add_argument("--out", type=Path, help="the JSON report (default: stdout, where Ray's raylet also writes)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TANDEM_AGREEMENT_SAMPLE", "0")  # a sample runs the teacher; these builds import vectors
    os.environ.setdefault("TANDEM_LOG_LEVEL", "WARNING")
    args.work.mkdir(parents=True, exist_ok=True)
    versions = []
    if args.only != "synthetic":
        from models.bundle.versions import read_current

        versions.append(read_current(scifact_root(args.data, args.work)))
    if args.only != "scifact":
        versions += synthetic_versions(args.data, args.work, args.size, args.kinds.split(","))
    texts, vectors = query_set(args.data, seed=0)

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # as tests/conftest.py: the loopback only
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from cluster.coordinator import connect

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=1)
    connect(cluster.address)
    report: dict[str, object] = {"cpu": cpu_model(), "nodes": args.nodes, "queries": len(texts),
                                 "batch": args.batch, "versions": {}}
    try:
        for version in versions:
            report["versions"][str(version)] = compare(version, texts, vectors, args.batch)  # type: ignore[index]
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    text = json.dumps(report, indent=2) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


def query_texts(data: Path) -> list[str]:
    """The 300 SciFact test queries' texts."""
    test_ids = {line.split("\t")[0] for line in (data / "qrels/test.tsv").read_text().splitlines()[1:]}
    return [q["text"] for q in map(json.loads, (data / "queries.jsonl").read_text().splitlines())
            if q["_id"] in test_ids]


def query_set(data: Path, seed: int) -> tuple[list[str], np.ndarray]:
    """The 300 SciFact test queries' texts, and as many dense query vectors near real documents."""
    texts = query_texts(data)
    ref = np.asarray(np.load(data / REFERENCE), dtype=np.float32)
    rng = np.random.default_rng(seed)
    picked = ref[rng.choice(len(ref), size=len(texts), replace=False)]
    noisy = picked + 0.03 * rng.standard_normal(picked.shape).astype(np.float32)
    return texts, noisy / np.linalg.norm(noisy, axis=1, keepdims=True)


if __name__ == "__main__":
    main()
