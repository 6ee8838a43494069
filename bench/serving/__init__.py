"""Serving over HTTP: load ladders against the bare limit, A/Bs of trees and settings, reloads, peers."""
