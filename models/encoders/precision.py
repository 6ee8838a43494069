"""The precisions each encoder may run in: checked by flags and settings without importing torch or onnxruntime."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class TeacherPrecision(StrEnum):
    """What may compute teacher vectors: fp32 (the reference), bf16 (CPU or GPU), fp16 (CUDA)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


TEACHER_PRECISIONS = tuple(p.value for p in TeacherPrecision)

# The student graphs a StudentManifest lists: int8 serves by default, fp32 is the reference.
StudentPrecision = Literal["int8", "fp32"]
