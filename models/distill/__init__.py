"""Distilling a small student into the teacher's embedding space (LEAF-style L2 alignment)."""
