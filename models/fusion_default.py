"""The fusion a new bundle records as its `mode: hybrid` default (see docs/BENCHMARKS.md for how it was chosen).

Chosen on SciFact's *train* queries only (never the test split), asymmetric (student queries).
"""

from __future__ import annotations

from models.manifest import FusionMethod, FusionSpec

DEFAULT_FUSION = FusionSpec(method=FusionMethod.CONVEX, alpha=0.5, rrf_k=60, depth=100)
