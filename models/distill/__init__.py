"""`tandem distill`: a small student trained into the teacher's embedding space, then exported to ONNX.

pipeline.py runs it end to end, refresh.py trains a served student on (`--from`), pick.py picks the segments it
trains on. By job: texts/ (corpus passages and pseudo-queries, train-split queries, examples and batches, the
tokenizer), model.py (the student network), training/ (the loop, losses, schedule, checkpoints, ridge
initialization, int8 emulation, soups), exporting/ (ONNX, int8 and the parity check; weights read back), presets.py.
"""
