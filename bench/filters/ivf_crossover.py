"""Where a filtered search over an IVF binary version should score the allowed rows exactly rather than search the IVF.

In process (no HTTP), on a version built by `tandem index build --index ivf` from bench/index/scale_10m.py's inputs,
each of scale_10m's filters is searched with each plan forced (`Planner(exact_share=1)`: the exact pass over the
allowed rows' codes by row; `Planner(exact_share=0)`: the IVF with its own nprobe and its over-fetch), one student
query at a time, each encoded just before its search as the service does. Reported per filter: allowed rows,
p50/p99 of the search, and recall@10 against exact float search among the allowed rows. models.search.planner's
IVF rule is set from where the exact plan stops being the faster one (docs/lab/2026-11-26-ivf-crossover.md).

    flock /tmp/tandem-heavy.lock python -m bench.filters.ivf_crossover --root ROOT --inputs /work/scale/inputs-1000000 \
        --student /work/bench/student
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.filters.filter_scale import exact_top, recall, timed_plan
from bench.harness.record import cpu_line, load_average
from bench.index.scale_10m import FILTERS, train_queries

log = logging.getLogger("ivf_crossover")


def measure(root: Path, inputs: Path, student: Path, queries: int, rounds: int) -> list[dict[str, object]]:
    """One row per filter and plan: allowed rows, p50/p99 ms of `search`, recall@10 against exact float."""
    from models.bundle.version import Bundle
    from models.bundle.versions import read_current
    from models.encoders.student import StudentEncoder
    from models.search import parse_filter, set_search_threads
    from models.search.planner import Planner

    set_search_threads(1)
    texts = train_queries(queries)
    encoder = StudentEncoder(student, "int8", 1)
    vectors = np.concatenate([encoder.encode([t], batch_size=1) for t in texts])
    columns = dict(np.load(inputs / "columns.npz"))
    masks = {name: None if allows is None else allows(columns) for name, _, allows in FILTERS}
    truth = exact_top(inputs / "vectors.f16.npy", vectors, masks, vectors.shape[1])
    plans = [("none", Planner()), ("exact", Planner(exact_share=1.0)), ("index", Planner(exact_share=0.0))]
    out: list[dict[str, object]] = []
    bundle = Bundle(root if (root / "manifest.json").is_file() else read_current(root), lexical=False)
    try:
        for name, body, _ in FILTERS:
            flt = parse_filter(body, bundle.filter_fields) if body else None
            allowed = len(columns["year"]) if masks[name] is None else int(np.count_nonzero(masks[name]))
            for plan, planner in plans[:1] if flt is None else plans[1:]:
                times, found = timed_plan(bundle, encoder, texts, flt, planner, rounds)
                row = {"case": name, "allowed": allowed, "plan": plan, "p50_ms": 1e3 * float(np.percentile(times, 50)),
                       "p99_ms": 1e3 * float(np.percentile(times, 99)), "recall": recall(found[: len(texts)],
                                                                                          truth[name])}
                log.info("%s", row)
                out.append(row)
    finally:
        bundle.close()
    return out


def render(rows: Sequence[dict[str, object]], n: int) -> str:
    lines = [f"### {n:,} documents", "", "| filter | allowed rows | plan | p50 ms | p99 ms | recall@10 |",
             "|---|---:|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['allowed']:,} | {r['plan']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['recall']:.3f} |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="the IVF binary version's root (or version)")
    parser.add_argument("--inputs", type=Path, required=True, help="scale_10m's inputs the version was built from")
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    n = len(np.load(args.inputs / "columns.npz")["year"])
    print(f"CPU: {cpu_line()}\nload before: {load_average()[1]}")
    rows = measure(args.root, args.inputs, args.student, args.queries, args.rounds)
    print(render(rows, n))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
