"""Writing an evaluation report directory: eval.json, matrix.md and ndcg_vs_dim.png.

The markdown is what docs/BENCHMARKS.md quotes; the plot shows how each quantization holds
up as MRL truncation shrinks the vectors, one panel per setup.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from models.eval_matrix import QUANTIZATIONS, Cell, format_matrix
from models.ir_metrics import NDCG, RECALL

log = logging.getLogger(__name__)

JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "eval.json", "matrix.md", "ndcg_vs_dim.png"


def cells_of(report: dict) -> list[Cell]:
    return [
        Cell(c["setup"], c["dim"], c["quantization"], c[NDCG], c[RECALL], c["retention"], c["rotation"])
        for c in report.get("matrix", [])
    ]


def write_report(report: dict, directory: Path) -> list[Path]:
    """Write the report files into `directory` (created if needed); returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / JSON_FILE]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    cells = cells_of(report)
    if cells:
        meta = report["meta"]
        header = (f"# {Path(meta['data']).name} [{meta['split']}]: nDCG@10 (retention of the teacher at the same "
                  f"dim and quantization)\n\n{meta['n_queries']} queries, {meta['n_docs']} docs, student ONNX "
                  f"{meta['precision']}.\n\n")
        paths.append(directory / MARKDOWN_FILE)
        paths[-1].write_text(header + format_matrix(cells) + "\n")
        paths.append(directory / PLOT_FILE)
        plot_matrix(cells, paths[-1])
    log.info("report written to %s", directory)
    return paths


def plot_matrix(cells: list[Cell], path: Path) -> None:
    """nDCG@10 against dims, one line per quantization (dashed: PCA-rotated), one panel per setup."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    setups = list(dict.fromkeys(c.setup for c in cells))
    fig, axes = plt.subplots(1, len(setups), figsize=(4 * len(setups), 3.6), sharey=True, squeeze=False)
    for ax, setup in zip(axes[0], setups, strict=True):
        for i, quantization in enumerate(QUANTIZATIONS):
            for rotation, style in (("none", "-"), ("pca", "--")):
                points = sorted((c.dim, c.ndcg_at_10) for c in cells
                                if (c.setup, c.quantization, c.rotation) == (setup, quantization, rotation))
                if points:
                    label = quantization if rotation == "none" else f"{quantization} (pca)"
                    ax.plot(*zip(*points, strict=True), style, color=f"C{i}", marker="o", label=label)
        ax.set_title(setup)
        ax.set_xlabel("dims")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("nDCG@10")
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
