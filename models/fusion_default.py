"""The fusion a new bundle records as its `mode: hybrid` default, so `tandem eval` and the service agree.

Chosen on SciFact's *train* queries only (809 queries; never the test split), asymmetric (a `quick`
student's queries + BM25), by bench/choose_fusion.py (docs/BENCHMARKS.md, "Hybrid retrieval"):
convex 0.3 / 0.4 / 0.5 gave nDCG@10 0.7243 / 0.7306 / 0.7260, RRF 0.6980, BM25 alone 0.6964. Convex
beat RRF on every set measured (issue 26: also a held-out BEIR set, 111.9% against 106.5%), and the
best weight there was 0.3 to 0.5; 0.4, the train optimum, sits in the flat middle of that range.
"""

from __future__ import annotations

from models.manifest import FusionMethod, FusionSpec

DEFAULT_FUSION = FusionSpec(method=FusionMethod.CONVEX, alpha=0.4, rrf_k=60, depth=100)
