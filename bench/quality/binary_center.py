"""Binary codes at low dims: centering before taking signs, and the rescoring depth, on a BEIR split.

Teacher document vectors (the embedding store, or imported reference vectors) are PCA-rotated as
`--rotation pca` bundles are; teacher and student queries are encoded here. For each dim, the table gives
nDCG@10 of float, Hamming-only and binary+rescore (oversample 4, 8, 16), with plain and centered codes,
and the student's retention of the teacher's float nDCG@10 at the same dim and rotation.

    python -m bench.quality.binary_center --data ../shared/data/scifact --split test \
        --student .tandem/students/scifact-quick \
        --docs ../shared/data/scifact/reference/all-mpnet-base-v2.corpus.f16.npy
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import faiss
import numpy as np

from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.quantize import binary_encode, int8_decode
from models.bundle.vectors.rotation import fit_pca_rotation
from models.contract import truncate
from models.datasets.beir import load_beir
from models.encoders.registry import resolve
from models.encoders.student import StudentEncoder
from models.evaluation.metrics import NDCG, TOP_K, run_from_rows, score_run
from models.search import VectorIndex, rotate

log = logging.getLogger("bench.binary_center")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--docs", type=Path, required=True, help="teacher document vectors (.npy, corpus order)")
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--dims", default="512,256,128")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cache", type=Path, help="keep the encoded queries here, to rerun without encoding")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data = load_beir(args.data, args.split)
    doc_ids = [d.id for d in data.corpus]
    docs = np.asarray(np.load(args.docs), dtype=np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    qids, texts = list(data.queries), list(data.queries.values())
    from models.encoders.teacher import TeacherEncoder

    cache = args.cache / f"queries-{args.data.name}-{args.split}.npz" if args.cache else None
    if cache is not None and cache.is_file():
        queries = dict(np.load(cache))
    else:
        queries = {"teacher": TeacherEncoder(resolve("teacher")).encode_queries(texts),
                   "asymmetric": StudentEncoder(args.student, "int8").encode(texts, batch_size=1)}
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, **queries)
    rows_out = []
    for rotation in ("none", "pca"):
        matrix = fit_pca_rotation(docs) if rotation == "pca" else None
        d_rot = rotate(docs, matrix)
        for dim in [int(x) for x in args.dims.split(",")]:
            result: dict[str, object] = {"rotation": rotation, "dim": dim}
            for who, q in queries.items():
                q_rot = rotate(q, matrix)

                def ndcg(scores: np.ndarray, rows: np.ndarray) -> float:
                    return score_run(data.qrels, run_from_rows(qids, scores, rows, doc_ids))[NDCG]

                exact = VectorIndex.build(d_rot, dim, Quantization.FLOAT)
                result[f"{who} float"] = ndcg(*exact.search(q_rot, TOP_K))
                for center in (False, True):
                    tag = "centered" if center else "plain"
                    index = VectorIndex.build(d_rot, dim, Quantization.BINARY, center=center)
                    qt = truncate(q_rot, dim)
                    codes = binary_encode(qt if index.space.center is None else qt - index.space.center)
                    dist, rows = index.index.search(codes, TOP_K)
                    result[f"{who} hamming {tag}"] = ndcg(-dist.astype(np.float32), rows)
                    for over in (4, 8, 16):
                        result[f"{who} rescore x{over} {tag}"] = ndcg(*index.search(q_rot, TOP_K, over))
                # centered, then a random orthogonal rotation of the kept dims: spreads PCA's uneven variance
                # evenly over the sign bits (as PCA-RR / ITQ do); rescoring is unchanged
                index = VectorIndex.build(d_rot, dim, Quantization.BINARY, center=True)
                assert index.space.center is not None and index.space.calibration is not None
                spin = np.linalg.qr(np.random.default_rng(0).standard_normal((dim, dim)))[0].astype(np.float32)
                codes = faiss.IndexBinaryFlat(dim)
                codes.add(binary_encode((truncate(d_rot, dim) - index.space.center) @ spin))
                qt = truncate(q_rot, dim)
                dist, rows = codes.search(binary_encode((qt - index.space.center) @ spin), TOP_K * 16)
                result[f"{who} hamming balanced"] = ndcg(-dist[:, :TOP_K].astype(np.float32), rows[:, :TOP_K])
                for over in (4, 8, 16):
                    out_s = np.zeros((len(qt), TOP_K), dtype=np.float32)
                    out_r = np.zeros((len(qt), TOP_K), dtype=np.int64)
                    for i, cand in enumerate(rows[:, : TOP_K * over]):
                        vecs = int8_decode(np.asarray(index.rescore_codes[cand]), index.space.calibration)
                        order = np.argsort(-(vecs @ qt[i]), kind="stable")[:TOP_K]
                        out_s[i], out_r[i] = (vecs @ qt[i])[order], cand[order]
                    result[f"{who} rescore x{over} balanced"] = ndcg(out_s, out_r)
            rows_out.append(result)
            log.info("%s", result)
    keys = [k for k in rows_out[0] if k not in ("rotation", "dim")]
    print(f"{args.data.name} [{args.split}] {len(qids)} queries; nDCG@10 (asymmetric: retention of teacher float)")
    print("| rotation | dim | " + " | ".join(keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for r in rows_out:
        cells = []
        for k in keys:
            value = float(r[k])  # type: ignore[arg-type]
            if k.startswith("asymmetric"):
                cells.append(f"{value:.4f} ({value / float(r['teacher float']):.1%})")  # type: ignore[arg-type]
            else:
                cells.append(f"{value:.4f}")
        print(f"| {r['rotation']} | {r['dim']} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=2) + "\n")


if __name__ == "__main__":
    main()
