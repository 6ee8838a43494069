"""Row masks for filters: numpy bool arrays (what the payload index uses) against pyroaring bitmaps, at 1M rows.

Why: a filter becomes the set of rows it allows, which FAISS takes as a flat bitmap (IDSelectorBitmap) and the
exact pass as a list of rows. pyroaring is the field's library for row sets; this measures the two things a
filter does with them, each side starting from the form it would keep on disk:

1. a keyword condition ANDed with a broad one (50%), to FAISS's bitmap and the count: numpy scatters two
   posting lists (int32 rows) into masks; pyroaring deserializes a bitmap per posting list, ANDs them, and
   turns the result into FAISS's layout;
2. a range on a number: the rows of a run of sorted values (so in value order, not row order) into a row set:
   numpy scatters them; pyroaring builds a bitmap from them (from the unsorted rows, and after sorting them).

pyroaring is not a dependency of tandem: install it apart (`pip install --target DIR pyroaring`) and pass DIR.

    python -m bench.filters.bitmap_choice --pyroaring /tmp/pyroaring-probe
"""

from __future__ import annotations

import argparse
import array
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bench.harness.record import add_output_args, cpu_line, load_average, publish, start_logging

SECTION = "bitmap-choice"
SHARES = (0.0001, 0.01, 0.1, 0.5, 0.97)


def best_ms(run: Callable[[], object], rounds: int) -> float:
    """The fastest of `rounds` runs (a micro-benchmark on a shared machine: the minimum is the cost)."""
    fastest = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        fastest = min(fastest, time.perf_counter() - began)
    return fastest * 1e3


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyroaring", type=Path, required=True, help="Directory pyroaring is installed in.")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=30)
    add_output_args(parser)
    args = parser.parse_args(argv)
    start_logging()
    sys.path.insert(0, str(args.pyroaring))
    import pyroaring
    from pyroaring import BitMap

    n, rng = args.n, np.random.default_rng(0)
    _, load_before = load_average()
    anded, ranges = [], []
    for share in SHARES:
        a = np.sort(rng.choice(n, int(share * n), replace=False)).astype(np.int32)
        b = np.sort(rng.choice(n, n // 2, replace=False)).astype(np.int32)
        sa, sb = BitMap(a.tolist()).serialize(), BitMap(b.tolist()).serialize()

        def masks(a: np.ndarray = a, b: np.ndarray = b) -> tuple[int, np.ndarray]:
            m = np.zeros(n, dtype=bool)
            m[a] = True
            m2 = np.zeros(n, dtype=bool)
            m2[b] = True
            m &= m2
            return int(np.count_nonzero(m)), np.packbits(m, bitorder="little")

        def bitmaps(sa: bytes = sa, sb: bytes = sb) -> tuple[int, np.ndarray]:
            z = BitMap.deserialize(sa) & BitMap.deserialize(sb)
            m = np.zeros(n, dtype=bool)
            m[np.frombuffer(z.to_array(), dtype=np.uint32)] = True
            return len(z), np.packbits(m, bitorder="little")

        def bitmaps_and(sa: bytes = sa, sb: bytes = sb) -> int:
            return len(BitMap.deserialize(sa) & BitMap.deserialize(sb))

        assert masks()[0] == bitmaps()[0] and np.array_equal(masks()[1], bitmaps()[1])
        anded.append((share, best_ms(masks, args.rounds), best_ms(bitmaps, args.rounds),
                      best_ms(bitmaps_and, args.rounds)))
        rows = rng.permutation(n)[: int(share * n)].astype(np.uint32)  # a range's rows, in value order
        unsorted = array.array("I", rows.tobytes())
        ranges.append((share, best_ms(lambda rows=rows: np.zeros(n, dtype=bool).__setitem__(rows, True), args.rounds),
                       best_ms(lambda unsorted=unsorted: BitMap(unsorted), args.rounds),
                       best_ms(lambda rows=rows: BitMap(array.array("I", np.sort(rows).tobytes())), args.rounds)))
    lines = [f"# Row masks: numpy against pyroaring ({time.strftime('%Y-%m-%d')})", "",
             f"Command: `python -m bench.filters.bitmap_choice --pyroaring DIR` (pyroaring {pyroaring.__version__} "
             "installed "
             f"apart; numpy {np.__version__}); {n:,} rows, the fastest of {args.rounds} runs each.", "",
             f"- Machine: {cpu_line()}; load {load_before} before, {load_average()[1]} after", "",
             "**A keyword condition AND a 50% condition**, to the count and FAISS's bitmap (ms):", "",
             "| first condition's share | numpy masks | pyroaring | pyroaring: the AND and count alone |",
             "|---:|---:|---:|---:|"]
    lines += [f"| {100 * s:.2f}% | {m:.3f} | {r:.3f} | {a:.3f} |" for s, m, r, a in anded]
    lines += ["", "**A range's rows (in value order) into a row set** (ms):", "",
              "| share | numpy scatter into a mask | pyroaring from the rows | pyroaring, rows sorted first |",
              "|---:|---:|---:|---:|"]
    lines += [f"| {100 * s:.2f}% | {m:.3f} | {r:.3f} | {o:.3f} |" for s, m, r, o in ranges]
    publish(args.lab, SECTION, "\n".join(lines) + "\n", write=not args.no_write)


if __name__ == "__main__":
    main()
