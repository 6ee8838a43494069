"""A scoped key's limits, applied where a request's options are built: its collections and its filter.

The key's filter is ANDed with the request's own (`with_key_filter`) in the Filter the search receives, so every
mode (dense, lexical, hybrid) evaluates both on the same rows before ranking, and nothing else in the request
(its filter, offset, mode, fields, min_score) can widen it: an `or` in the request sits under the AND, an offset
pages within what the AND allows (docs/decisions.md#a-keys-filter-is-anded-where-the-options-are-built).

A collection the key may not see is a 404, worded as for a collection that does not exist, so a key learns no
names it was not given (docs/decisions.md#a-collection-a-key-may-not-see-is-a-404). The key-less endpoints follow
the same rule (`may_name_collections`): /readyz and /metrics, open to anyone who reaches them, name no collection
unless the request bears TANDEM_METRICS_TOKEN or TANDEM_METRICS_NAMES is on; unset or blank, they name none.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from fastapi import HTTPException, Request

from models.search import Filter, FilterError, parse_filter
from service.core.loader import SearcherLoader
from service.http.errors import CollectionNotFound, NoDefaultCollection
from service.http.keyring import KeyScope
from service.settings import ServiceSettings


class Collection(Protocol):
    """What the HTTP layer needs of a collection (service.core.collections.Collection)."""

    @property
    def name(self) -> str: ...
    @property
    def loader(self) -> SearcherLoader: ...
    @property
    def settings(self) -> ServiceSettings: ...


class Collections(Protocol):
    """What the HTTP layer needs of the collection set (service.core.collections.CollectionSet)."""

    @property
    def default(self) -> str | None: ...
    def get(self, name: str) -> Collection | None: ...


def collection_for(collections: Collections, name: str | None, key: KeyScope) -> Collection:
    """The collection `name` (None: the default one) if it is served and `key` may see it; else a 404, the same
    whether it is not served or not the key's."""
    if name is None:
        if collections.default is None:
            raise NoDefaultCollection()
        name = collections.default
    collection = collections.get(name)
    if collection is None or not key.sees(name):
        raise CollectionNotFound(name)
    return collection


def with_key_filter(request_filter: Filter | None, key: KeyScope, collection: str,
                    fields: frozenset[str]) -> Filter | None:
    """The request's filter ANDed with the key's (checked against the version that answers: `fields`). A key
    whose filter names a field this version lacks opens nothing here: a 403 naming its id and the field."""
    if key.filter is None:
        return request_filter
    try:
        own = parse_filter(key.filter, fields)
    except FilterError as exc:
        raise HTTPException(403, f"key {key.id!r} may not search collection {collection!r}: its filter does "
                                 f"not apply to the version in service ({exc.message})") from None
    if request_filter is None:
        return own
    return Filter(tree=("and", (own.tree, request_filter.tree)))


def may_name_collections(request: Request, settings: ServiceSettings) -> bool:
    """Whether /readyz and /metrics may name the collections to this request: TANDEM_METRICS_NAMES, or
    `Authorization: Bearer <TANDEM_METRICS_TOKEN>` (compared as sha256 digests: the timing tells nothing). Anything
    else, a wrong token or an API key included, gets no names: these endpoints check no key, so they fail closed."""
    if settings.metrics_names:
        return True
    if settings.metrics_token is None:
        return False
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    expected = hashlib.sha256(settings.metrics_token.get_secret_value().encode()).digest()
    return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), expected)
