"""GET /index: the bundle in service, its search modes and the fields a filter may name, with their types.

What a client needs to build a search before sending one: the search page (GET /) builds its mode selector and
filter box from it. Behind the API keys like /search, since field names describe the corpus. With several
collections it describes the default one; GET /collections/{name} (service.http.routes.collections) any other.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.http.describe import describe
from service.http.keyring import key_of
from service.http.schemas.common import ErrorBody
from service.http.schemas.search import IndexDescription
from service.http.scoping import collection_for

router = APIRouter(tags=["search"])


@router.get("/index", response_model=IndexDescription,
            responses={503: {"model": ErrorBody, "description": "Not loaded yet."},
                       404: {"model": ErrorBody, "description": "No default collection the key may see."}})
def describe_index(http: Request) -> IndexDescription:
    """The index that answers /search now (it changes at a hot reload), with its modes and filter fields."""
    return describe(collection_for(http.app.state.collections, None, key_of(http)).loader)
