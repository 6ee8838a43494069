"""The payload engine: typed metadata fields as sorted columns, filtered without reading the docstore.

`fields` (the field types, declared or inferred, and what the manifest says of them), `columns` (one field's
columns laid out in bounded memory), `writer` (building the index from the docstore) and `index` (`PayloadIndex`:
the columns memory-mapped and a filter evaluated on them).
"""
