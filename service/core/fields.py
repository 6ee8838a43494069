"""The fields a collection's filters may name, read from its manifest alone: what a scoped key's filter is checked
against when the keys are loaded (service.http.keyring), before (or while) the collection itself loads."""

from __future__ import annotations

import logging
from pathlib import Path

from models.bundle.version import read_bundle_manifest
from models.bundle.versions import resolve_bundle

log = logging.getLogger(__name__)


def manifest_fields(index: Path) -> frozenset[str] | None:
    """The fields a filter may name in the version `index` serves (as Bundle.filter_fields), read from its manifest;
    None when it cannot be read (the collection then fails to load, and a search checks the key again)."""
    try:
        manifest = read_bundle_manifest(resolve_bundle(index))
    except Exception as exc:  # any unreadable bundle: reported by its loader, not here
        log.debug("cannot read the manifest of %s: %s", index, exc)
        return None
    return frozenset([*manifest.metadata_fields, *(f.name for f in manifest.payload_fields)])
