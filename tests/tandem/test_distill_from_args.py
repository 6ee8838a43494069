"""`tandem distill` refuses a mix of --from and a fresh distillation's options before any work (fast tier)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from models.errors import InputError
from tandem.cli import app

runner = CliRunner()


@pytest.mark.parametrize(("args", "message"), [
    (["--index", "b", "--out", "o"], "--corpus is required"),
    (["--index", "b", "--out", "o", "--corpus", "c.jsonl", "--segment", "s1"], "--segment needs --from"),
    (["--index", "b", "--out", "o", "--from", "s", "--corpus", "c.jsonl"], "drop --corpus"),
    (["--index", "b", "--out", "o", "--from", "s", "--precision", "bf16"], "--precision sets a new distillation"),
])
def test_distill_refuses_options_that_do_not_go_together(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["distill", *args])
    assert isinstance(result.exception, InputError), result.output
    assert message in str(result.exception)
