"""`pip install ./python` installs every part of the relaxc package (relaxc.tvm, relaxc.serve,
relaxc.llm and whatever comes next), not just the top level."""

import os
import shutil
import subprocess
import sys

from test_tvm_ffi import ROOT


def python_files(top):
    """The .py files under top, relative to it, sorted."""
    return sorted(
        os.path.relpath(os.path.join(d, f), top)
        for d, _, files in os.walk(top)
        if "__pycache__" not in d
        for f in files
        if f.endswith(".py")
    )


def test_pip_installs_every_subpackage(tmp_path):
    # From a copy of the sources alone: a build/ left by an earlier install would fill the gaps.
    tree = tmp_path / "src"
    shutil.copytree(
        os.path.join(ROOT, "python"), tree, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    source = os.path.join(ROOT, "python", "relaxc")
    wanted = python_files(source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(tmp_path / "site"),
            str(tree),
        ],
        check=True,
        capture_output=True,
    )
    installed = tmp_path / "site" / "relaxc"
    got = python_files(installed)
    assert got == wanted
