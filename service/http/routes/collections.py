"""GET /collections and GET /collections/{name}: what a key may search, named as POST /collections/{name}/search
(service.http.routes.search) takes it. A collection the key may not see is left out of the list and is a 404 by
name, as one that is not served (service.http.scoping)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.core.loader import NotReady
from service.http.describe import describe
from service.http.keyring import key_of
from service.http.schemas.collections import CollectionList, CollectionSummary
from service.http.schemas.common import ErrorBody
from service.http.schemas.search import IndexDescription
from service.http.scoping import Collection, collection_for

router = APIRouter(tags=["collections"])


def summary(collection: Collection, default: str | None) -> CollectionSummary:
    state, error = collection.loader.state
    values: dict[str, object] = {"name": collection.name, "state": state.value, "error": error,
                                 "default": collection.name == default, "student": collection.settings.student.name}
    try:
        searcher = collection.loader.searcher()
    except NotReady:
        pass
    else:
        values.update(version=searcher.version, count=searcher.bundle.manifest.count)
    return CollectionSummary.model_validate(values)


@router.get("/collections", response_model=CollectionList, response_model_exclude_none=True)
def list_collections(http: Request) -> CollectionList:
    """The collections the request's key may see, loaded or not."""
    collections = http.app.state.collections
    key = key_of(http)
    return CollectionList(collections=[summary(c, collections.default) for c in collections if key.sees(c.name)])


@router.get("/collections/{name}", response_model=IndexDescription,
            responses={404: {"model": ErrorBody, "description": "No such collection, or one the key may not see."},
                       503: {"model": ErrorBody, "description": "Not loaded yet, or it failed to load."}})
def describe_collection(name: str, http: Request) -> IndexDescription:
    """The version collection `name` serves, its modes and filter fields (GET /index of that collection)."""
    return describe(collection_for(http.app.state.collections, name, key_of(http)).loader)
