"""What a collection's version in service may be asked: GET /index and GET /collections/{name} answer it."""

from __future__ import annotations

from service.core.loader import SearcherLoader
from service.http.schemas.search import FieldDescription, IndexDescription


def describe(loader: SearcherLoader) -> IndexDescription:
    """What the version `loader` serves may be asked: its summary, modes and filter fields."""
    with loader.lease() as searcher:
        manifest = searcher.bundle.manifest
        summary = searcher.index_summary()
    fields = [FieldDescription(name=f.name, type=f.type.value, declared=f.declared) for f in manifest.payload_fields]
    typed = {f.name for f in fields}
    fields += [FieldDescription(name=name, type=None, declared=False)
               for name in manifest.metadata_fields if name not in typed]
    return IndexDescription.model_validate({**summary, "fields": fields})
