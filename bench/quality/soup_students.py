"""Average finished students of one architecture into a new student directory (a post-hoc model soup).

Reproduces the post-hoc soups of docs/lab/2026-11-24-ablation-model-soups.md: the fp32 ONNX graphs'
float initializers are averaged one by one and the result is re-quantized with the export's own
quantize_onnx; tokenizer and student.json come from the first student, less its parity report, which
described the first student's graph and not the average. Score the result with
`tandem eval`. Students from one backbone and one export path have identical graphs; any other pair
is refused. `tandem distill` trains and averages members in one run with preset `members`.

    python -m bench.quality.soup_students --out /tmp/soup .tandem/students/a .tandem/students/b
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from models.distill.exporting.export import quantize_onnx
from models.encoders.student import read_student_manifest
from models.encoders.student_manifest import STUDENT_MANIFEST

log = logging.getLogger("soup_students")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("students", type=Path, nargs="+", help="student directories (tandem distill --out)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifests = [read_student_manifest(s) for s in args.students]
    graphs = [onnx.load(str(s / m.onnx_fp32)) for s, m in zip(args.students, manifests, strict=True)]
    weights = [{i.name: numpy_helper.to_array(i) for i in g.graph.initializer} for g in graphs]
    if any(w.keys() != weights[0].keys() for w in weights) or len({m.teacher.fingerprint for m in manifests}) > 1:
        raise SystemExit("the students differ in graph or teacher: they cannot be averaged")
    base = graphs[0]
    for init in base.graph.initializer:
        arrays = [w[init.name] for w in weights]
        if arrays[0].dtype.kind == "f":
            mean = np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)
            init.CopyFrom(numpy_helper.from_array(mean, init.name))
    shutil.copytree(args.students[0], args.out)
    onnx.save(base, str(args.out / manifests[0].onnx_fp32))
    quantize_onnx(args.out / manifests[0].onnx_fp32, args.out / manifests[0].onnx_int8)
    manifest = manifests[0].model_copy(update={"parity": None})
    (args.out / STUDENT_MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
    log.info("averaged %d students into %s", len(args.students), args.out)


if __name__ == "__main__":
    main()
