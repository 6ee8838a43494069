"""Writing an evaluation report directory: eval.json, setups.md and setups.png (every setup's row, the
lexical and hybrid ones included), and with the matrix matrix.md and ndcg_vs_dim.png.

The markdown is what the dated records of docs/lab/ quote; the plot shows how each quantization holds
up as MRL truncation shrinks the vectors, one panel per setup.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from models.evaluation.matrix import QUANTIZATIONS, Cell, format_matrix
from models.evaluation.metrics import NDCG, RECALL

log = logging.getLogger(__name__)

JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "eval.json", "matrix.md", "ndcg_vs_dim.png"
SETUPS_MARKDOWN, SETUPS_PLOT = "setups.md", "setups.png"
ROW_ORDER = ("teacher", "asymmetric", "student", "lexical", "teacher_hybrid", "hybrid")


def setup_rows(report: dict) -> list[tuple[str, float, float, float]]:
    """(setup, nDCG@10, Recall@100, retention of the teacher) for each row the report has."""
    rows = []
    for name in ROW_ORDER:
        if name in report:
            retention = 1.0 if name == "teacher" else report["retention"].get(name) or 0.0
            rows.append((name, report[name][NDCG], report[name][RECALL], retention))
    return rows


def format_setups(report: dict) -> str:
    lines = ["| setup | nDCG@10 | Recall@100 | retention of teacher nDCG@10 |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {nd:.4f} | {r:.4f} | {ret:.1%} |" for n, nd, r, ret in setup_rows(report)]
    return "\n".join(lines)


def plot_setups(report: dict, path: Path) -> None:
    """nDCG@10 of each setup as a bar, the teacher's as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = setup_rows(report)
    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2, 3.4))
    ax.bar([r[0] for r in rows], [r[1] for r in rows], color=[f"C{i}" for i in range(len(rows))])
    ax.axhline(report["teacher"][NDCG], color="k", linestyle="--", linewidth=1, label="teacher")
    for i, r in enumerate(rows):
        ax.text(i, r[1], f"{r[1]:.3f}", ha="center", va="bottom", fontsize="small")
    ax.set_ylabel("nDCG@10")
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    if "teacher" in report:
        paths.append(directory / SETUPS_MARKDOWN)
        paths[-1].write_text(format_setups(report) + "\n")
        paths.append(directory / SETUPS_PLOT)
        plot_setups(report, paths[-1])
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
