"""The indexer's choices that the CLI offers as typed options, importable without numpy, FAISS or torch."""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    """Where the teacher runs: this process, or Ray Data actors on a cluster (the `ray` extra)."""

    LOCAL = "local"
    RAY = "ray"


class ExportFormat(StrEnum):
    """`tandem index export`'s file formats."""

    PARQUET = "parquet"
    JSONL = "jsonl"
