"""The precisions each encoder may run in: checked by flags and settings without importing torch or onnxruntime.

`auto` is a request, never a recorded precision: `auto_precision` turns it into fp16 on CUDA, bf16 on a CPU
whose flags say it computes bf16 natively (AVX-512 BF16 or AMX), fp32 elsewhere (docs/decisions.md, "The
teacher's precision").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)


class TeacherPrecision(StrEnum):
    """What may compute teacher vectors: fp32 (the reference), bf16 (CPU or GPU), fp16 (CUDA)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


TEACHER_PRECISIONS = tuple(p.value for p in TeacherPrecision)
AUTO = "auto"


class PrecisionChoice(StrEnum):
    """What `--precision` accepts: a teacher precision, or `auto` (resolved by `auto_precision`)."""

    FP32 = TeacherPrecision.FP32.value
    BF16 = TeacherPrecision.BF16.value
    FP16 = TeacherPrecision.FP16.value
    AUTO = AUTO


# CPU flags (as /proc/cpuinfo spells them) under which torch runs bf16 matmuls natively; without them bf16 is
# emulated and slower than fp32.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

# The student graphs a StudentManifest lists: int8 serves by default, fp32 is the reference.
StudentPrecision = Literal["int8", "fp32"]


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of /proc/cpuinfo text (x86 `flags`, Arm `Features`), every processor's together."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def read_cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """This machine's CPU flags; none where the file is unreadable (not Linux), which makes `auto` pick fp32."""
    try:
        return cpu_flags(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        log.info("cannot read %s (%s): --precision auto assumes no bf16 support", path, exc)
        return frozenset()


def auto_precision(device: str, flags: Iterable[str]) -> TeacherPrecision:
    """fp16 on CUDA (today's default there), bf16 on a CPU with native bf16, fp32 (the reference) elsewhere."""
    if device.startswith("cuda"):
        return TeacherPrecision.FP16
    return TeacherPrecision.BF16 if BF16_CPU_FLAGS & set(flags) else TeacherPrecision.FP32


def local_precision(requested: str | None, device: str, flags: Iterable[str] | None = None) -> TeacherPrecision:
    """What a teacher in this process runs in for `--precision requested` on `device`: the precision given; for
    `auto`, `auto_precision` of this CPU's flags; for None, fp16 on CUDA and fp32 (the reference) elsewhere. The one
    rule of `index build` and `distill`, so a demo's index, targets and agreement sample agree."""
    if requested is None:
        return TeacherPrecision.FP16 if device.startswith("cuda") else TeacherPrecision.FP32
    if requested == AUTO:
        picked = auto_precision(device, read_cpu_flags() if flags is None else flags)
        log.info("--precision auto: %s on %s", picked.value, device)
        return picked
    return TeacherPrecision(requested)
