"""The two encoders and what says how a model directory turns text into a vector.

`teacher` (torch; documents, offline) and `student` (onnxruntime; queries, online), with the student's manifest
(`student_manifest`); `encoder_setup` (reading a model directory as sentence-transformers does: pooling, prompts,
Dense layers), `pooling` (those, in torch), `registry` (the model store, cards, fingerprints) and `precision` (what
each encoder may run in, checked without importing torch).
"""
