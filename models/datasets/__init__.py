"""What training and evaluation both read: BEIR directories, and the teacher's vectors of texts, cached.

Kept apart so that models.distill and models.evaluation never import each other (pyproject's
import-linter contracts).
"""
