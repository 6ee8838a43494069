"""GET /index: the bundle in service, its search modes and the fields a filter may name, with their types.

What a client needs to build a search before sending one: the search page (GET /) builds its mode selector and
filter box from it. Behind the API keys like /search, since field names describe the corpus.
"""

from __future__ import annotations

from fastapi import APIRouter

from service.http.deps import LoaderDep
from service.http.schemas.common import ErrorBody
from service.http.schemas.search import FieldDescription, IndexDescription

router = APIRouter(tags=["search"])


@router.get("/index", response_model=IndexDescription,
            responses={503: {"model": ErrorBody, "description": "Not loaded yet."}})
def describe_index(loader: LoaderDep) -> IndexDescription:
    """The index that answers /search now (it changes at a hot reload), with its modes and filter fields."""
    with loader.lease() as searcher:
        manifest = searcher.bundle.manifest
        summary = searcher.index_summary()
    fields = [FieldDescription(name=f.name, type=f.type.value, declared=f.declared) for f in manifest.payload_fields]
    typed = {f.name for f in fields}
    fields += [FieldDescription(name=name, type=None, declared=False)
               for name in manifest.metadata_fields if name not in typed]
    return IndexDescription.model_validate({**summary, "fields": fields})
