"""The relaxc wheel is the whole tool: `pip install ./python` builds (with maturin) a wheel that
holds the `relaxc` binary and every part of the Python package, declares one extra per job, and
works from a fresh virtual environment with no cargo and no checkout on PATH.

The wheel is built once for the module, from the checkout, with cargo's dev profile into target/
(cargo releases the build lock before it runs tests), so under `cargo test` it reuses the
test build's artifacts instead of a release build of its own; what is tested is the packaging,
not the optimiser. The build uses the maturin this Python has (.ci/run installs it), so the test
needs no network; without maturin it is skipped, saying so."""

import email
import os
import subprocess
import sys
import venv
import zipfile

import pytest
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


def clean_env(**extra):
    """An environment with no cargo, no rustc, no checkout and no development relaxc: PATH holds
    the system's folders only, and nothing points Python or relaxc at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RELAXC", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("maturin", reason="pip install maturin (builds the relaxc wheel)")
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, MATURIN_PEP517_ARGS="--profile dev")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "./python"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return out / wheels[0]


def test_the_wheel_holds_the_binary_and_every_subpackage(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "relaxc-0.1.0.data/scripts/relaxc" in names, names
    packaged = sorted(n for n in names if n.startswith("relaxc/") and n.endswith(".py"))
    wanted = sorted("relaxc/" + p for p in python_files(os.path.join(ROOT, "python", "relaxc")))
    assert packaged == wanted


def test_each_job_has_its_extra(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(z.read(meta_name))
    requires = meta.get_all("Requires-Dist")

    def extra(name):
        return sorted(
            r.split(";")[0].split("==")[0].split("[")[0].strip() for r in requires if f"extra == '{name}'" in r
        )

    assert extra("onnx") == ["apache-tvm", "onnx", "onnxsim"]
    assert extra("tvm") == ["apache-tvm"]
    assert "gguf" in extra("llm") and "apache-tvm" in extra("llm")
    assert "ray" in extra("serve") and "apache-tvm-ffi" in extra("serve")


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh virtual environment with the wheel installed. It sees this Python's site-packages
    (numpy, TVM, onnx) so the test needs no download; relaxc itself comes from the wheel alone."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=True).create(home)
    python = str(home / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
        env=clean_env(),
    )
    return home


def test_relaxc_runs_from_the_venv_without_cargo(installed):
    relaxc = installed / "bin" / "relaxc"
    out = subprocess.run([str(relaxc), "--version"], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("relaxc 0.1.0")


def test_the_package_finds_its_own_binary(installed, tmp_path):
    python = str(installed / "bin" / "python")
    probe = "import relaxc, sys; sys.stdout.write(relaxc.find_relaxc())"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == str(installed / "bin" / "relaxc")
    # $RELAXC still wins (a development build to try), and a wrong one is named.
    bad = clean_env(RELAXC=str(tmp_path / "nope"))
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, env=bad, cwd=tmp_path)
    assert out.returncode != 0 and "nope" in out.stderr


def test_onnx_builds_a_model_from_the_venv(installed, tmp_path):
    pytest.importorskip("tvm", reason="pip install apache-tvm==0.27.0.post1")
    onnx = pytest.importorskip("onnx", reason="pip install onnx")
    pytest.importorskip("onnxsim", reason="pip install onnxsim")
    from onnx import TensorProto, helper

    python = str(installed / "bin" / "python")
    out = subprocess.run([python, "-m", "relaxc.onnx", "--help"], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "relu.onnx"))
    so = tmp_path / "relu.so"
    out = subprocess.run(
        [python, "-m", "relaxc.onnx", str(tmp_path / "relu.onnx"), "-o", str(so)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert so.stat().st_size > 0


# Each job's command, what it imports that its extra brings, and the extra: a Python without
# them gets a one-line error naming the pip command that fixes it (run here with the modules
# blocked, as a Python that lacks them sees it).
MISSING_EXTRAS = [
    ("relaxc.onnx", ["m.onnx", "-o", "m.so"], "tvm", "onnx"),
    ("relaxc.llm", ["build", "m.gguf", "-o", "m.so"], "tvm", "llm"),
    ("relaxc.serve", ["m.so"], "ray", "serve"),
]


@pytest.mark.parametrize("module, args, blocked, extra", MISSING_EXTRAS)
def test_a_missing_extra_is_named_with_its_fix(tmp_path, module, args, blocked, extra):
    run = (
        f"import runpy, sys; sys.modules[{blocked!r}] = None; sys.argv = [{module!r}, *{args!r}]; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.startswith("error: python -m " + module), out.stderr
    assert f"pip install 'relaxc[{extra}]'" in out.stderr and "Traceback" not in out.stderr, out.stderr
