"""The payload index's row mask for one condition, two ways, on one column of N rows: scattering the condition's
rows (its slices of the sorted `rows`, or their complement) against comparing each row's rank (`ranks`).

Why: at 10M documents `date >= 1991` (10 in 35) spent about 15 ms of a 27 ms query scattering its 2.9M rows into
the mask (docs/lab/2026-11-26-scale-10m-3.md). models.bundle.payload.index chooses between the two by SCATTER_COST, a
scattered row's cost in compared rows; this measures both sides at shares from 1 in 35 to 34 in 35, through the real
`Column`, its arrays written as payload_writer lays them out: an integer field of `--values` values (default: the days
of 35 years, as scale_10m's `date`; 35 is its `year`, whose runs of rows are longer and so scatter faster), 1% of rows
without one.

    python -m bench.filters.mask_cost --rows 10000000
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness.record import cpu_line
from models.bundle.payload.fields import FieldType, PayloadField
from models.bundle.payload.index import SCATTER_COST, Column
from models.bundle.payload.writer import field_parts, part_name

log = logging.getLogger("bench.mask_cost")
SHARES = 35  # conditions select k in 35 of the values


def write_column(directory: Path, n: int, distinct: int, seed: int = 0) -> None:
    """One integer field at position 0: values 0..distinct-1 uniform, 1% absent; rows ascending within a value."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, distinct, n)
    values[rng.random(n) < 0.01] = -1  # absent
    present = np.flatnonzero(values >= 0).astype(np.int32)
    order = np.argsort(values[present], kind="stable")
    rows = present[order]
    ranks = np.full(n, len(rows), dtype=np.int32)
    ranks[rows] = np.arange(len(rows), dtype=np.int32)
    (directory / "payload").mkdir()
    for part, array in {"values": values[present][order].astype(np.int64), "rows": rows, "ranks": ranks,
                        "absent": np.flatnonzero(values < 0).astype(np.int32)}.items():
        np.save(directory / part_name(0, part), array)


def open_column(directory: Path, field: PayloadField, n: int) -> Column:
    """The field's column over its parts, mapped read-only as the served payload index maps them."""
    arrays = {part: np.load(directory / part_name(0, part), mmap_mode="r")
              for part in field_parts(field.type, field.ranks)}
    return Column(field, arrays, n)


def median_ms(column: Column, leaf: tuple, repeats: int) -> float:
    column.mask(leaf)  # pages in
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        column.mask(leaf)
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--values", type=int, default=35 * 365, help="distinct values of the column")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(message)s")
    log.info("%s; %d rows, %d values; SCATTER_COST %d", cpu_line(), args.rows, args.values, SCATTER_COST)
    with tempfile.TemporaryDirectory() as tmp:
        write_column(Path(tmp), args.rows, args.values)
        field = PayloadField(name="year", type=FieldType.INTEGER, ranks=True)
        ranked = open_column(Path(tmp), field, args.rows)
        scattered = open_column(Path(tmp), field.model_copy(update={"ranks": False}), args.rows)  # written before
        log.info("| condition | share | without ranks, ms (plan) | with ranks, ms | chosen |")
        log.info("|---|---|---|---|---|")
        def cut(k: int) -> int:  # the value above which k in 35 of the values lie
            return args.values - args.values * k // SHARES

        cases = [(f"x >= {cut(k)}", k, ("range", "year", "number", [("gte", cut(k))])) for k in
                 (1, 3, 5, 10, 17, 25, 34)]
        cases.append((f"{cut(15)} <= x < {cut(5)}", 10, ("range", "year", "number", [("gte", cut(15)),
                                                                                     ("lt", cut(5))])))
        for name, share, leaf in cases:
            assert np.array_equal(ranked.mask(leaf), scattered.mask(leaf))
            a, b = median_ms(scattered, leaf, args.repeats), median_ms(ranked, leaf, args.repeats)
            log.info("| `%s` | %d in %d | %.2f (%s) | %.2f | %s |", name, share, SHARES, a, scattered.mask_plan(leaf),
                     b, ranked.mask_plan(leaf))


if __name__ == "__main__":
    main()
