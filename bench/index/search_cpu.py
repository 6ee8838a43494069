"""CPU per query of a bundle's `search` (one thread), by stage, per source tree, and whether the trees answer alike.

Why (issue 56): a served static-student query is mostly its search (100k flat binary: the Hamming scan, the sign
codes of the query, the int8 rescoring of the candidates, the documents' fetch). In a child process of each tree's
code, the same query vectors (the student's encodes of SciFact queries, made once by the first tree and handed to
every child) go through `search` (dense, top_k 10, the service's oversample) one at a time on one thread; the child
reports `time.thread_time` per query over the timed pass and the same per stage (each stage's call timed alone),
and writes every query's rows and float32 scores, which must be equal, bit for bit, between trees. Trees and rounds
take turns, so a slow minute of a shared machine falls on all.

    python -m bench.index.search_cpu --index BUNDLE --student DIR --tree before=/tmp/before --tree after=. \
        --queries 400 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.harness.record import LoadSpan, command_line, machine

CHILD = """
import json, sys, time
from pathlib import Path
import faiss, numpy as np
from threadpoolctl import threadpool_limits
from models.bundle.version import Bundle
from models.bundle.versions import resolve_bundle
from models.search import SearchOptions, search
from models.search.query import documents
from models.contract import truncate
index, vectors_file, texts_file, out_file = sys.argv[1:5]
faiss.omp_set_num_threads(1)
threadpool_limits(limits=1, user_api="blas")
bundle = Bundle(resolve_bundle(Path(index)))
vectors = truncate(np.load(vectors_file), bundle.manifest.dim)  # MRL, as the service's encoder hands them over
texts = json.loads(Path(texts_file).read_text())
opts = SearchOptions(top_k=10)
for i in range(min(100, len(vectors))):
    search(bundle, vectors[i : i + 1], [texts[i]], opts, 4)
rows, scores = [], []
began = time.thread_time()
for i in range(len(vectors)):
    hits = search(bundle, vectors[i : i + 1], [texts[i]], opts, 4).hits[0]
    rows.append([h.row for h in hits]); scores.append([h.score for h in hits])
whole = (time.thread_time() - began) / len(vectors)
seg = bundle.segments[0].vectors
stages = dict.fromkeys(("sign codes", "hamming scan", "rescoring", "documents"), 0.0)
for i in range(len(vectors)):
    t0 = time.thread_time()
    q = np.ascontiguousarray(bundle.space.rotate(vectors[i : i + 1]))
    codes = seg.space.sign_codes(q)
    t1 = time.thread_time()
    _, cand = seg.index.search(codes, seg.rescore_pool(10, 4, 10))
    t2 = time.thread_time()
    s, r = seg._rescore(q[0], cand[0][cand[0] >= 0], 10)
    t3 = time.thread_time()
    documents(bundle, r)
    t4 = time.thread_time()
    for name, spent in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        stages[name] += spent
stages = {k: v / len(vectors) for k, v in stages.items()}
np.savez(out_file, rows=np.array(rows), scores=np.array(scores, dtype=np.float32))
print(json.dumps({"search": whole, **stages}))
"""

ENCODE = """
import json, sys
from pathlib import Path
import numpy as np
from models.encoders.student import StudentEncoder
student, texts_file, out_file = sys.argv[1:4]
encoder = StudentEncoder(Path(student), "int8", 1)
texts = json.loads(Path(texts_file).read_text())
np.save(out_file, np.concatenate([encoder.encode_counted([t], batch_size=1)[0] for t in texts]).astype(np.float32))
"""


def _child(tree: Path, script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'client'}"}
    return subprocess.run([sys.executable, "-c", script, *args], cwd=tree, env=env, check=True, capture_output=True,
                          text=True).stdout


def main(argv: Sequence[str] | None = None) -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--tree", action="append", required=True, help="name=path of a source tree")
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/scifact"))
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    texts = [json.loads(line)["text"] for line in (args.data / "queries.jsonl").open()][: args.queries]
    span = LoadSpan()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    answers: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        texts_file, vectors_file = Path(tmp) / "texts.json", Path(tmp) / "vectors.npy"
        texts_file.write_text(json.dumps(texts))
        _child(Path(next(iter(trees.values()))).resolve(), ENCODE, str(args.student), str(texts_file),
               str(vectors_file))
        for _ in range(args.rounds):
            for name, tree in trees.items():
                out = Path(tmp) / f"{name}.npz"
                line = _child(Path(tree).resolve(), CHILD, str(args.index), str(vectors_file), str(texts_file),
                              str(out)).strip().splitlines()[-1]
                results[name].append(json.loads(line))
                answers[name] = dict(np.load(out))
    first = next(iter(answers.values()))
    print(f"# {command_line(argv)}\n# {machine()}\n# load average {span.text()}")
    for name, answer in answers.items():
        same_rows = np.array_equal(answer["rows"], first["rows"])  # type: ignore[index]
        same_scores = np.array_equal(answer["scores"].view(np.uint32), first["scores"].view(np.uint32))  # type: ignore[index]
        print(f"{name}: rows equal to {next(iter(answers))}'s: {same_rows}; float32 scores bit for bit: {same_scores}"
              f" ({len(texts)} queries)")
    stages = list(next(iter(results.values()))[0])
    print("| tree | " + " | ".join(f"{s} ms/q" for s in stages) + " |")
    print("|---|" + "---:|" * len(stages))
    for name, runs in results.items():
        cells = []
        for stage in stages:
            values = [r[stage] * 1e3 for r in runs]
            cells.append(f"{statistics.median(values):.3f} ({' / '.join(f'{v:.3f}' for v in values)})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
