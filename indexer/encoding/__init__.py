"""How the teacher encodes a corpus: in this process (`encode`, which builds and updates share) or across a Ray
cluster (`ray_engine`)."""
