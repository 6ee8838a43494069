"""The CLI refuses bad arguments before any work, naming the option and listing the choices (fast tier)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tandem.cli import app

runner = CliRunner()


def _plain(text: str) -> str:
    """Help and errors without rich's colours and box drawing, on one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize(("args", "option", "choices"), [
    (["index", "build", "--corpus", "c.jsonl", "--quantization", "int4"], "--quantization",
     ["float", "int8", "binary"]),
    (["index", "build", "--corpus", "c.jsonl", "--rotation", "svd"], "--rotation", ["none", "pca"]),
    (["index", "build", "--corpus", "c.jsonl", "--index", "lsh"], "--index", ["flat", "hnsw", "ivf"]),
    (["index", "build", "--corpus", "c.jsonl", "--precision", "fp64"], "--precision", ["fp32", "bf16", "fp16", "auto"]),
    (["index", "build", "--corpus", "c.jsonl", "--engine", "spark"], "--engine", ["local", "ray"]),
    (["index", "export", "b", "--out", "o", "--format", "xml"], "--format", ["parquet", "jsonl"]),
    (["eval", "--data", "d", "--index", "i", "--student", "s", "--precision", "fp16"], "--precision",
     ["int8", "fp32"]),
])
def test_a_value_outside_the_choices_exits_2_naming_the_option(args: list[str], option: str,
                                                                choices: list[str]) -> None:
    result = runner.invoke(app, args)
    out = _plain(result.output)
    assert result.exit_code == 2, out
    assert f"Invalid value for '{option}'" in out
    assert all(f"'{choice}'" in out for choice in choices), out


@pytest.mark.parametrize(("command", "listed"), [
    (["index", "build"], ["<float|int8|binary>", "<none|pca>", "<flat|hnsw|ivf|auto>", "<fp32|bf16|fp16|auto>",
                          "<local|ray>"]),
    (["index", "export"], ["<parquet|jsonl>"]),
    (["eval"], ["<int8|fp32>"]),
])
def test_help_lists_the_choices(command: list[str], listed: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    out = _plain(result.output)
    assert result.exit_code == 0, out
    assert all(choice in out for choice in listed), out


def test_a_missing_required_option_exits_2_naming_it() -> None:
    result = runner.invoke(app, ["index", "build"])
    assert result.exit_code == 2
    assert "Missing option '--corpus'" in _plain(result.output)
