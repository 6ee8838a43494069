"""BM25's statistics across tenants (issue 55): in one collection, IDF and the average length count every document,
so a key whose filter keeps one tenant's documents gets scores that move with the other tenants' documents (from
which it could infer how often they use a term: Elasticsearch's document-level security has the same limit). The
way out docs/operations.md offers is a collection per tenant, whose statistics are its own documents': checked
here on the metadata fixture, its `topic` standing for the tenant."""

from __future__ import annotations

import json
from pathlib import Path

from indexer.build import BuildRequest, build
from models.bundle.version import Bundle
from models.search import SearchOptions, parse_filter, search
from models.search.query import Mode

QUERY = "bread loaf rise dough oven"


def _scores(bundle: Bundle, tenant: str | None) -> dict[str, float]:
    flt = None if tenant is None else parse_filter({"field": "topic", "eq": tenant}, bundle.filter_fields)
    hits = search(bundle, None, [QUERY], SearchOptions(top_k=20, mode=Mode.LEXICAL, filter=flt), oversample=4).hits[0]
    return {h.doc.id: h.score for h in hits}


def test_a_collection_per_tenant_scores_with_its_own_statistics_where_a_filter_does_not(
        meta_bundle: Path, meta_corpus: Path, tmp_path: Path, tiny_home: Path) -> None:
    """The tenant's own collection is built with the tiny teacher (tests/fixtures/tiny_home.py): only BM25 is
    compared, which no teacher changes."""
    lines = [json.loads(line) for line in meta_corpus.read_text().splitlines()]
    own_corpus = tmp_path / "food.jsonl"
    own_corpus.write_text("".join(json.dumps(d) + "\n" for d in lines if d["metadata"]["topic"] == "food"))
    build(BuildRequest(corpus=own_corpus, out=tmp_path / "food", metadata_extra=True))
    shared, own = Bundle(meta_bundle), Bundle(tmp_path / "food")
    try:
        filtered, alone = _scores(shared, "food"), _scores(own, None)
        assert filtered and set(filtered) == set(alone)  # the filter keeps the tenant's documents, and only those
        # the same documents, other scores: the shared collection's IDF and average length count the other topics'
        assert all(abs(filtered[d] - alone[d]) > 1e-3 for d in filtered)
        # its own collection scores the tenant's documents exactly as a filter on the tenant's own bundle would
        assert _scores(own, "food") == alone
    finally:
        shared.close()
        own.close()
