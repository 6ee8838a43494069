"""The lexical engine: BM25 over the passages the teacher saw, one set of postings per segment.

`info` (what the manifest says of it), `postings` (tokenizing, writing postings, scoring with the version's
statistics, and bm25s's index of bundles built before segments), `pruning` (exact top-k by MaxScore).
"""
