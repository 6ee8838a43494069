"""The sharded search's cost per request against the single box's, on one machine (issue 57).

For one version (any root's version with a lexical index, several segments), each request runs, taking turns so
all three see the same machine load: the single box (`models.search.search` in this process), the coordinator over
shards in this process (`LocalShard`: the statistics round, the merge and the fetch, no hop), and the coordinator
over shard deployments on a local Ray Serve cluster (the hops). Every sharded answer is compared with the box's (ids,
order, float32 scores); a mismatch is counted, and reported. Queries: random unit vectors and two or three words
drawn from the version's own documents (seeded), one query per request, mode by mode.

    python -m bench.cluster.shard_hops --version ROOT/vNAME --shards 2 --replicas 1 --requests 200
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_model
from models.bundle.version import Bundle
from models.search import Mode, SearchOptions, documents, search
from models.search.shards import local_coordinator, plan_shards

log = logging.getLogger("bench.shard_hops")


def _queries(bundle: Bundle, n: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = random.Random(seed)
    rows = bundle.live_rows()
    words = [w for d in documents(bundle, rows[: min(len(rows), 2000)]) for w in d.passage().split() if w.isalpha()]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 3))) for _ in range(n)]
    vectors = np.random.default_rng(seed).standard_normal((n, bundle.manifest.teacher.dim)).astype(np.float32)
    return texts, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _answer(hits: list) -> list[tuple[str, int, float]]:
    return [(h.doc.id, h.row, h.score) for h in hits]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", type=Path, required=True, help="a version directory (ROOT/vNAME)")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--requests", type=int, default=200, help="per mode")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from cluster.coordinator import ClusterSearch, connect

    box = Bundle(args.version)
    plan = plan_shards([p.count for p in box.manifest.parts], args.shards)
    local, shards = local_coordinator(args.version, plan)
    connect("local", num_cpus=2 * args.shards * args.replicas)
    ray_search = ClusterSearch(args.shards, args.replicas, cpus_per_replica=0.5)
    ray_search.deploy(args.version, plan)
    texts, vectors = _queries(box, args.requests, args.seed)
    runs = {
        "box": lambda v, q, o: search(box, v, q, o, 4).hits,
        "shards in process": lambda v, q, o: local.search(v, q, o, 4).hits,
        "shards on Ray Serve": lambda v, q, o: ray_search.search(v, q, o, 4)[1].hits,
    }
    out: dict[str, object] = {"cpu": cpu_model(), "version": args.version.name, "documents": box.count,
                              "segments": len(box.segments), "plan": plan, "replicas": args.replicas,
                              "requests_per_mode": args.requests, "modes": {}}
    try:
        for mode in Mode:
            opts = SearchOptions(top_k=args.top_k, mode=mode)
            for run in runs.values():  # warm-up, once each
                run(vectors[:1], texts[:1], opts)
            times: dict[str, list[float]] = {name: [] for name in runs}
            mismatches = 0
            for i in range(args.requests):
                v, q = vectors[i : i + 1], texts[i : i + 1]
                answers = {}
                for name, run in runs.items():
                    began = time.perf_counter()
                    answers[name] = run(v, q, opts)
                    times[name].append((time.perf_counter() - began) * 1e3)
                want = _answer(answers["box"][0])
                mismatches += sum(_answer(answers[n][0]) != want for n in runs if n != "box")
            out["modes"][mode.value] = {  # type: ignore[index]
                name: {"p50_ms": round(float(np.percentile(t, 50)), 3), "p99_ms": round(float(np.percentile(t, 99)), 3)}
                for name, t in times.items()} | {"mismatches": mismatches}
    finally:
        ray_search.close()
        for shard in shards:
            shard.close()
        box.close()
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
