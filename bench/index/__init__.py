"""Building and changing the index: index types, scale, first stages, segments, compaction, verification."""
