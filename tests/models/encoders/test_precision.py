"""`--precision auto`: bf16 where the CPU computes it natively, fp32 elsewhere, fp16 on CUDA; from /proc/cpuinfo."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.encoders.precision import TeacherPrecision, auto_precision, cpu_flags, read_cpu_flags

# Abridged /proc/cpuinfo of three real kinds of machine: the flag lists are as the kernel prints them.
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
GENOA = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512_bf16 avx512_vnni
"""
SKYLAKE = """processor\t: 0
model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid bf16 i8mm
"""


@pytest.mark.parametrize(("cpuinfo", "device", "expected"), [
    (SAPPHIRE_RAPIDS, "cpu", TeacherPrecision.BF16),
    (GENOA, "cpu", TeacherPrecision.BF16),
    (SKYLAKE, "cpu", TeacherPrecision.FP32),  # AVX-512 without its BF16 extension: bf16 would be emulated
    (GRAVITON, "cpu", TeacherPrecision.FP32),  # Arm's bf16 is not a flag torch's CPU bf16 path is measured on
    ("", "cpu", TeacherPrecision.FP32),  # no cpuinfo at all (not Linux): the reference
    (SKYLAKE, "cuda", TeacherPrecision.FP16),
    (SAPPHIRE_RAPIDS, "cuda:1", TeacherPrecision.FP16),
])
def test_auto_picks_from_the_flags(cpuinfo: str, device: str, expected: TeacherPrecision) -> None:
    assert auto_precision(device, cpu_flags(cpuinfo)) is expected


def test_flags_are_read_from_every_processor_line() -> None:
    flags = cpu_flags(SAPPHIRE_RAPIDS + GRAVITON)
    assert {"amx_tile", "avx512_bf16", "asimd", "bf16"} <= flags
    assert "GenuineIntel" not in flags and "spectre_v1" not in flags  # other keys' values are not flags


def test_an_unreadable_cpuinfo_means_no_flags(tmp_path: Path) -> None:
    assert read_cpu_flags(tmp_path / "absent") == frozenset()
    (tmp_path / "cpuinfo").write_text(GENOA)
    assert "avx512_bf16" in read_cpu_flags(tmp_path / "cpuinfo")
