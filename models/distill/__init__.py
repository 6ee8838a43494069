"""`tandem distill`: a small student trained into the teacher's embedding space, then exported to ONNX.

pipeline.py runs it end to end. By job: data.py (texts and pseudo-queries from the corpus),
queries.py (real train-split queries), dataset.py (examples and batches), tokens.py (the tokenizer),
model.py (the student network), ridge.py (its initial projection), loss.py and scores.py (the losses),
schedule.py (steps and learning rate), trainer.py (the loop), checkpoints.py, int8_emulation.py,
soup.py (weight averaging), export.py (ONNX, int8 and the parity check), presets.py.
"""
