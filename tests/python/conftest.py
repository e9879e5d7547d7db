"""What the Python tests share: the kernel library of this build's relaxc, loaded once per
session through tvm_ffi, as {global name: function}; the check of a list of failing calls; and
the kernels pinned to AVX2 on x86-64, as the fixtures were recorded (tests/common/mod.rs's
pin_recorded_kernels says why): tests of the instruction sets take them off (unpinned_env)."""

import os
import platform
import subprocess

import pytest
import tvm_ffi
from test_tvm_ffi import relaxc_binary

PINS = {"RELAXC_QUANT_ISA": "avx2", "RELAXC_GEMM_AVX512": "0"}
if platform.machine() in ("x86_64", "AMD64"):
    for name, value in PINS.items():
        os.environ.setdefault(name, value)


def unpinned_env(**changes):
    """os.environ without the pins, with changes: a process that runs the CPU's own kernels."""
    env = {k: v for k, v in os.environ.items() if k not in PINS}
    env.update(changes)
    return env


def build_kernel_library(path):
    """Builds the kernel library at path, with its {global name: export} table beside it as
    path + ".tsv" (what tests that call it from a process of their own read); returns the table."""
    out = subprocess.run([relaxc_binary(), "kernel-library", "-o", path], capture_output=True, text=True, check=True)
    with open(path + ".tsv", "w") as table:
        table.write(out.stdout)
    return dict(line.split("\t") for line in out.stdout.splitlines())


@pytest.fixture(scope="session")
def library(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kernels") / "librelaxc_kernels.so")
    names = build_kernel_library(path)
    module = tvm_ffi.load_module(path)
    return {name: module[export] for name, export in names.items()}


def assert_each_raises(cases):
    """Each (call, exception type, text): the call raises that type with the text in its message."""
    for call, kind, text in cases:
        with pytest.raises(kind) as e:
            call()
        assert text in str(e.value), str(e.value)
