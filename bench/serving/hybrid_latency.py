"""Hybrid against dense latency at 100k documents, in one run of one `tandem serve`.

The corpus is synthetic but looks real: each document is a SciFact title and 3–8 SciFact sentences
drawn at random, so BM25 sees real vocabulary and document lengths; its vectors are synthesized
around the reference teacher embeddings (bench/index_types.synthesize), imported, not encoded.
Queries are SciFact *train* queries, sent one at a time (closed loop), the modes taking turns query
by query, so that both see the same machine load.

    python -m bench.serving.hybrid_latency --scifact ../shared/data/scifact --student .tandem/students/scifact-quick
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_flags, cpu_model
from bench.harness.servers import served
from bench.index.index_types import synthesize

log = logging.getLogger("bench.hybrid_latency")
MODES = ("dense", "lexical", "hybrid")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def make_corpus(scifact: Path, n: int, seed: int, workdir: Path) -> tuple[Path, Path, Path]:
    rng = random.Random(seed)
    titles, sentences = [], []
    with (scifact / "corpus.jsonl").open() as fh:
        for line in fh:
            doc = json.loads(line)
            titles.append(doc["title"])
            sentences += [s for s in _SENTENCE.split(doc["text"]) if len(s) > 20]
    corpus, ids_path, vectors_path = workdir / "corpus.jsonl", workdir / "ids.json", workdir / "vectors.npy"
    ids = [f"syn{i}" for i in range(n)]
    with corpus.open("w") as out:
        for doc_id in ids:
            text = " ".join(rng.choice(sentences) for _ in range(rng.randint(3, 8)))
            out.write(json.dumps({"_id": doc_id, "title": rng.choice(titles), "text": text}) + "\n")
    ids_path.write_text(json.dumps(ids))
    docs, _ = synthesize(scifact / "reference" / "all-mpnet-base-v2.corpus.f16.npy", n, 10, seed)
    np.save(vectors_path, docs)
    return corpus, ids_path, vectors_path



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scifact", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path(".tandem/bench/hybrid-latency"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--build-only", action="store_true", help="Make the corpus and the bundle, then stop.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.workdir.mkdir(parents=True, exist_ok=True)
    bundle = args.workdir / f"bundle-{args.docs}"
    if not (bundle / "manifest.json").is_file():
        corpus, ids, vectors = make_corpus(args.scifact, args.docs, args.seed, args.workdir)
        from indexer.build import BuildRequest, build

        began = time.perf_counter()
        build(BuildRequest(corpus=corpus, out=bundle, embeddings=vectors, ids=ids, force=True))
        log.info("built %s in %.0f s", bundle, time.perf_counter() - began)
    if args.build_only:
        return
    train = {line.split("\t")[0] for line in list((args.scifact / "qrels" / "train.tsv").open())[1:]}
    by_id = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (args.scifact / "queries.jsonl").open()}
    queries = [by_id[q] for q in sorted(train) if q in by_id][: args.queries + args.warmup]
    latencies: dict[str, list[float]] = {m: [] for m in MODES}
    stages: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    with served(bundle.resolve(), args.student.resolve(), args.workdir / "serve.log",
                {"TANDEM_LOG_LEVEL": "WARNING"}) as server:
        for i, query in enumerate(queries):
            order = MODES[i % 3:] + MODES[: i % 3]  # rotate who goes first
            for mode in order:
                began = time.perf_counter()
                response = server.client.post("/search", json={"query": query, "top_k": 10, "mode": mode})
                elapsed = (time.perf_counter() - began) * 1e3
                response.raise_for_status()
                if i < args.warmup:
                    continue
                latencies[mode].append(elapsed)
                for stage, ms in response.json()["timing_ms"].items():
                    stages[mode].setdefault(stage, []).append(ms)
    report = {"docs": args.docs, "queries": len(latencies["dense"]), "cpu": cpu_model(), "flags": cpu_flags(),
              "date": time.strftime("%Y-%m-%d"), "modes": {}}
    print(f"{args.docs} docs, {report['queries']} queries per mode; CPU {report['cpu']} ({report['flags']})")
    print("| mode | p50 ms | p95 ms | encode p50 | search p50 | lexical p50 |\n|---|---:|---:|---:|---:|---:|")
    for mode in MODES:
        lat = np.asarray(latencies[mode])
        row = {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
               **{f"{s}_p50": float(np.percentile(v, 50)) for s, v in stages[mode].items()}}
        report["modes"][mode] = row
        print(f"| {mode} | {row['p50']:.2f} | {row['p95']:.2f} | {row['encode_p50']:.2f} | "
              f"{row['search_p50']:.2f} | {row['lexical_p50']:.2f} |")
    ratio = report["modes"]["hybrid"]["p50"] / report["modes"]["dense"]["p50"]
    report["hybrid_over_dense_p50"] = ratio
    print(f"hybrid p50 / dense p50 = {ratio:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
