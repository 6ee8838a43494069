"""A version's life after its build: updates, compaction and merges, each publishing the next version.

`request` (what a writer is asked), `changes` (upserts and deletes read from a file), `live` (a version's live
documents and vectors, read in chunks), `next_version` (the manifest and steps every writer shares), `segments`
(changes applied as a new segment), `update`, `rewrite` (the update of a bundle built before segments), `compact`,
`merge` and `merge_policy`.
"""
