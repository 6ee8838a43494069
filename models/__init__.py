"""Encoders and the embedding-space contract shared by the indexer and the service."""
