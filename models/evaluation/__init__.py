"""`tandem eval`: retrieval quality of the teacher, the student and their mixes on a BEIR directory.

run.py drives a run, matrix.py scores every dim × quantization × rotation, metrics.py holds the
IR metrics (pytrec_eval), report.py writes the table, JSON and plots. It reads BEIR files and the
teacher's cached vectors through models.datasets, never through models.distill.
"""
