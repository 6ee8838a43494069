"""What the bundle's engines share: storage helpers that know nothing of vectors, BM25 or payload fields.

`docstore` (`docs.sqlite`: row → document), `dictionary` (sorted strings on disk), `spill` (grouping rows by a code
in bounded memory), `row_file` (rows read with pread), `prefetch` (page-cache warming), `rows` (row masks over a
segment), `top_k` (ranking, ties by row) and `integrity` (files checked against the manifest's sha256 as read).
"""
