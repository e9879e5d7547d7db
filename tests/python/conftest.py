"""What the Python tests share: the kernel library of this build's relaxc, loaded once per
session through tvm_ffi, as {global name: function}; and the check of a list of failing calls."""

import subprocess

import pytest
import tvm_ffi
from test_tvm_ffi import relaxc_binary


@pytest.fixture(scope="session")
def library(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kernels") / "librelaxc_kernels.so")
    out = subprocess.run(
        [relaxc_binary(), "kernel-library", "-o", path],
        capture_output=True,
        text=True,
        check=True,
    )
    names = dict(line.split("\t") for line in out.stdout.splitlines())
    module = tvm_ffi.load_module(path)
    return {name: module[export] for name, export in names.items()}


def assert_each_raises(cases):
    """Each (call, exception type, text): the call raises that type with the text in its message."""
    for call, kind, text in cases:
        with pytest.raises(kind) as e:
            call()
        assert text in str(e.value), str(e.value)
