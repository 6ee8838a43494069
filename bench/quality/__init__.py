"""Retrieval quality and agreement: students against their teacher, fusion and binary codes, on BEIR splits."""
