"""A static student's encode, one query per call, one thread: the served path (word cache + lean sum) against the
path before it (the `tokenizers` call + the plain sum) and a 6-layer int8 student, blocks taking turns.

Why: issue 56 asks for a static encode p50 ≤ 0.1 ms and ≥ 20× the 6-layer student's in the same run. Before
timing, it checks that the word cache gives the tokenizer's own ids, and the served vectors the old path's bits,
on every query and corpus passage given plus hostile texts (unicode, accents, CJK, control characters, over-length).

    python -m bench.encoding.static_encode --static STUDENT --six-layer STUDENT6 --data /work/shared/data/scifact
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bench.harness.record import LoadSpan, command_line, machine

HOSTILE = ["café naïve résumé", "東京の天気 是什么", "Ünïcödé ÀÉÎÕÜ", "emoji 🙂", "ctrl\x01x\x1fy", "tab\tnew\nline",
           "non\u00a0breaking", "[MASK] <mask> <s>", "a\x00b", "x" * 300, "word " * 400, "Ελληνικά и русский"]


def old_encode(student: object) -> Callable[[str], np.ndarray]:
    """The static encode as it was: the tokenizer's call, fancy indexing of the memmap, `.sum`, `np.linalg.norm`."""
    tokenizer, rows = student.tokenizer, student.static.rows  # type: ignore[attr-defined]

    def encode(text: str) -> np.ndarray:
        total = rows[np.asarray(tokenizer.encode(text).ids, dtype=np.intp)].sum(axis=0, dtype=np.float32)
        norm = float(np.linalg.norm(total))
        return total / norm if norm > 0.0 else total
    return encode


def texts_of(data: Path, limit: int) -> tuple[list[str], list[str]]:
    """(query texts, query + passage + hostile texts) from a BEIR folder."""
    queries = [json.loads(line)["text"] for line in (data / "queries.jsonl").open()]
    passages = []
    with (data / "corpus.jsonl").open() as fh:
        for line, _ in zip(fh, range(limit), strict=False):
            row = json.loads(line)
            passages += [row.get("title", ""), row["text"]]
    return queries, queries + passages + HOSTILE


def timed(encoders: dict[str, Callable[[str], object]], texts: Sequence[str], rounds: int, passes: int
          ) -> dict[str, list[float]]:
    """ms per call, each encoder's block of texts in turn, `rounds` times (3 untimed calls open each block)."""
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for encode in encoders.values():
        for text in texts[:30]:
            encode(text)
    for r in range(rounds):
        block = texts[r::rounds]
        for name, encode in encoders.items():
            for text in block[:3]:
                encode(text)
            for _ in range(passes):
                for text in block:
                    began = time.perf_counter()
                    encode(text)
                    times[name].append((time.perf_counter() - began) * 1000)
    return times


def main(argv: Sequence[str] | None = None) -> None:
    from models.encoders.student import StudentEncoder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--static", type=Path, required=True, help="A static student's directory.")
    parser.add_argument("--six-layer", type=Path, help="A 6-layer student's directory, timed in the same run.")
    parser.add_argument("--data", type=Path, required=True, help="BEIR folder: queries.jsonl, corpus.jsonl.")
    parser.add_argument("--passages", type=int, default=5000, help="Corpus rows whose title and text are checked.")
    parser.add_argument("--queries", type=int, default=300, help="Query texts timed.")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--passes", type=int, default=4)
    args = parser.parse_args(argv)
    span = LoadSpan()
    static = StudentEncoder(args.static, threads=1)
    assert static.static is not None and static._word_ids is not None, "not a static student with a word cache"
    queries, checked = texts_of(args.data, args.passages)
    old = old_encode(static)
    same_ids = sum(static._word_ids.ids(t) == static.tokenizer.encode(t).ids for t in checked)
    same_bits = sum(np.array_equal(static.encode([t])[0], old(t)) for t in checked)
    print(f"{command_line(argv)}\n- Machine: {machine()}")
    print(f"- ids equal to the tokenizer's: {same_ids}/{len(checked)}; vectors bit for bit: {same_bits}/{len(checked)}")
    stages = {"word cache ids": static._word_ids.ids, "tokenizer ids": lambda t: static.tokenizer.encode(t).ids}
    encoders: dict[str, Callable[[str], object]] = {
        "static, served (word cache + lean sum)": lambda t: static.encode([t]), "static, before (tokenizer + sum)": old,
        **stages}
    if args.six_layer:
        six = StudentEncoder(args.six_layer, precision="int8", threads=1)
        encoders["6-layer student, int8"] = lambda t: six.encode([t])
    times = timed(encoders, queries[: args.queries], args.rounds, args.passes)
    six_p50 = float(np.percentile(times["6-layer student, int8"], 50)) if args.six_layer else None
    print("\n| encoder | calls | p50 ms | p90 ms | mean ms | 6-layer p50 ÷ this p50 |\n|---|---:|---:|---:|---:|---:|")
    for name, ms in times.items():
        p50 = float(np.percentile(ms, 50))
        ratio = f"{six_p50 / p50:.1f}×" if six_p50 else "n/a"
        print(f"| {name} | {len(ms):,} | {p50:.4f} | {float(np.percentile(ms, 90)):.4f} | "
              f"{statistics.fmean(ms):.4f} | {ratio} |")
    print(f"\n- Load average: {span.text()}")


if __name__ == "__main__":
    main()
