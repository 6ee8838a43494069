"""Agreement of a student with its teacher, per segment of a version (issue 45).

`draw` picks a segment's sample queries (the indexer keeps them: indexer.sample, models.bundle.sample); `score`
asks the student and the teacher the same queries over the version as served and compares their top-10s. No torch:
the service scores in the background (service.core.agreement), `tandem index check` on the command line.
"""

from models.agreement.score import THRESHOLD, SegmentAgreement, Verdict, below_threshold, score_segments, verdict

__all__ = ["THRESHOLD", "SegmentAgreement", "Verdict", "below_threshold", "score_segments", "verdict"]
