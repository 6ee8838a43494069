"""The student in and out of ONNX: `export` (the student directory, int8 and the parity check) and
`onnx_weights` (torch weights read back from a published fp32 graph)."""
