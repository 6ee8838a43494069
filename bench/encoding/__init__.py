"""Query encoding: the student's encode time, its profile, its int8 variants, and what disturbs it."""
