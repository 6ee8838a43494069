"""Memory of deep binary rescoring: parallel searches at offset + top_k, chunked as served against one array.

Why (issue 55): binary rescoring decoded its whole pool, (offset + top_k) × oversample rows, to float32 at once;
offset 9,000 with top_k 1,000 at ×16 is 160,000 rows, 491 MB at 768 dimensions, per request. This builds a flat
binary index of N random sign codes and an int8 rescoring file of N random rows (the index's space fitted on a few
thousand random vectors: what is measured is memory, not recall), then runs `--parallel` threads, each one search
of `--depth` hits at `--oversample` (what models.search.query asks of a segment for offset + top_k = depth), in a
child process per variant: `chunked` (VectorIndex.chunk_rows, as served) and `whole` (one chunk: the code before).
Each child samples its RssAnon (anonymous memory: what a request allocates; the rescoring file's mapped pages are
page cache, RssFile, shared and reclaimable) every 2 ms from before the searches start, and reports the peak's
rise, with RssFile's rise beside it. One BLAS and one FAISS thread per search, as the service runs them.

    python -m bench.index.rescore_memory --rows 1000000 --dim 768 --work /tmp/rescore-memory [--variants chunked]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def make(work: Path, rows: int, dim: int) -> None:
    """The sign codes and the int8 rescoring file, written in chunks (never all in memory as float)."""
    rng = np.random.default_rng(0)
    work.mkdir(parents=True, exist_ok=True)
    codes = np.lib.format.open_memmap(work / "codes.npy", mode="w+", dtype=np.uint8, shape=(rows, dim // 8))
    rescore = np.lib.format.open_memmap(work / "rescore.u8.npy", mode="w+", dtype=np.uint8, shape=(rows, dim))
    for start in range(0, rows, 100_000):
        n = min(100_000, rows - start)
        codes[start : start + n] = rng.integers(0, 256, (n, dim // 8), dtype=np.uint8)
        rescore[start : start + n] = rng.integers(0, 256, (n, dim), dtype=np.uint8)
    codes.flush()
    rescore.flush()


def child(work: Path, dim: int, depth: int, oversample: int, parallel: int, chunked: bool) -> dict[str, float]:
    import faiss
    from threadpoolctl import threadpool_limits

    from models.bundle.vectors.index import VectorIndex
    from models.bundle.vectors.index_spec import IndexSpec, Quantization

    faiss.omp_set_num_threads(1)
    threadpool_limits(limits=1, user_api="blas")
    x = np.random.default_rng(1).standard_normal((4096, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    space = VectorIndex.build(x, dim, Quantization.BINARY).space
    flat = faiss.IndexBinaryFlat(dim)
    flat.add(np.load(work / "codes.npy"))
    rescore = np.load(work / "rescore.u8.npy", mmap_mode="r")
    index = VectorIndex(Quantization.BINARY, dim, flat, space, rescore, IndexSpec(oversample=oversample))
    if not chunked:
        index.chunk_rows = index.count  # one array, as before chunks
    queries = space.rotate(np.random.default_rng(2).standard_normal((parallel, dim)).astype(np.float32))
    index.search(queries[:1], depth, oversample, head=depth)  # warm: the file's pages and FAISS's first call
    anon0, file0 = _status("RssAnon"), _status("RssFile")
    peak = {"anon": anon0, "file": file0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["anon"], peak["file"] = max(peak["anon"], _status("RssAnon")), max(peak["file"], _status("RssFile"))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    began = time.perf_counter()
    threads = [threading.Thread(target=index.search, args=(queries[i : i + 1], depth, oversample),
                                kwargs={"head": depth}) for i in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    done.set()
    sampler.join()
    return {"anon_rise_mb": (peak["anon"] - anon0) / 1e6, "file_rise_mb": (peak["file"] - file0) / 1e6,
            "pool": index.rescore_rows(depth, oversample, depth), "chunk_rows": index.chunk_rows, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--depth", type=int, default=10_000, help="offset + top_k")
    parser.add_argument("--oversample", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--variants", default="chunked,whole", help="Comma-separated: chunked, whole.")
    parser.add_argument("--keep", action="store_true", help="Keep the files in --work (to run another variant).")
    parser.add_argument("--variant", choices=["chunked", "whole"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(child(args.work, args.dim, args.depth, args.oversample, args.parallel,
                               args.variant == "chunked")))
        return
    if not (args.work / "rescore.u8.npy").is_file():
        make(args.work, args.rows, args.dim)
    try:
        for variant in args.variants.split(","):
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant], check=True,
                                 capture_output=True, text=True).stdout
            print(variant, out.strip(), flush=True)
    finally:
        if not args.keep:
            for name in ("codes.npy", "rescore.u8.npy"):
                (args.work / name).unlink(missing_ok=True)
            args.work.rmdir()


if __name__ == "__main__":
    main()
