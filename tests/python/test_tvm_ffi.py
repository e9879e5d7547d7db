"""relaxc models as tvm-ffi modules: every fixtures/tvm model and case through
tvm_ffi.load_module, in bytecode and compiled mode, bit for bit against TVM's recorded outputs;
errors, threads, two models in one process, torch tensors when torch is importable.

Needs numpy, pytest and apache-tvm-ffi (no TVM). The relaxc binary comes from $RELAXC
(tests/python.rs sets it), else target/release/relaxc or target/debug/relaxc.
"""

import glob
import os
import shutil
import subprocess
import threading

import numpy as np
import pytest
import tvm_ffi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "fixtures", "tvm")
MODES = ["bytecode", "compiled"]


def relaxc_binary():
    for candidate in [
        os.environ.get("RELAXC"),
        os.path.join(ROOT, "target/release/relaxc"),
        os.path.join(ROOT, "target/debug/relaxc"),
    ]:
        if candidate and os.path.exists(candidate):
            return candidate
    pytest.skip("no relaxc binary: set RELAXC or cargo build")


def fixture_names():
    names = []
    for d in sorted(glob.glob(os.path.join(FIXTURES, "*"))):
        if os.path.exists(os.path.join(d, "m.tar")) and not os.path.exists(os.path.join(d, "scenarios.json")):
            names.append(os.path.basename(d))
    return names


def cases(name, prefix):
    found = sorted(glob.glob(os.path.join(FIXTURES, name, f"{prefix}_*.in.npz")))
    return [os.path.basename(p)[len(prefix) + 1 : -len(".in.npz")] for p in found]


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


_built = {}


def build(name, mode, build_dir, copy=None):
    """The model built once per session; `copy` gives a private copy under another name (its
    own library instance: a stateful model's constants start fresh)."""
    key = (name, mode)
    if key not in _built:
        so = os.path.join(build_dir, f"{name}.{mode}.so")
        subprocess.run(
            [relaxc_binary(), "compile", os.path.join(FIXTURES, name, "m.tar"), "--exec-mode", mode, "-o", so],
            check=True,
        )
        _built[key] = so
    if copy is None:
        return _built[key]
    private = os.path.join(build_dir, f"{name}.{mode}.{copy}.so")
    shutil.copy(_built[key], private)
    return private


def load_args(path):
    """Arguments from an .in.npz: argN tensors, argN.shape shapes, argN.prim scalars."""
    data = np.load(path)
    args = {}
    for key in data.files:
        index = int(key.split(".")[0][3:])
        value = data[key]
        if key.endswith(".shape"):
            args[index] = tvm_ffi.Shape([int(v) for v in value])
        elif key.endswith(".prim"):
            args[index] = int(value)
        else:
            args[index] = tvm_ffi.from_dlpack(value)
    return [args[i] for i in range(len(args))]


def flatten(value, out):
    """Results as the fixtures store them (tuples flattened depth-first)."""
    if isinstance(value, tvm_ffi.Tensor):
        out.append(np.from_dlpack(value))
    elif isinstance(value, tvm_ffi.Shape):
        out.append(np.array(list(value), dtype="int64"))
    elif isinstance(value, (tvm_ffi.Array, list, tuple)):
        for v in value:
            flatten(v, out)
    elif isinstance(value, bool):
        out.append(np.array(value))
    elif isinstance(value, int):
        out.append(np.array(value, dtype="int64"))
    elif isinstance(value, float):
        out.append(np.array(value, dtype="float64"))
    else:
        raise TypeError(f"unexpected result {type(value)}")
    return out


def assert_bitwise(outs, expected_path):
    want = np.load(expected_path)
    assert len(outs) == len(want.files)
    for i, got in enumerate(outs):
        ref = want[f"out{i}"]
        assert got.dtype == ref.dtype and got.shape == ref.shape, (
            f"out{i}: {got.dtype}{got.shape} vs {ref.dtype}{ref.shape}"
        )
        assert got.tobytes() == ref.tobytes(), f"out{i}: bytes differ from TVM's"


def ok_params():
    return [(n, c, m) for n in fixture_names() for c in cases(n, "ok") for m in MODES]


def fail_params():
    return [(n, c, m) for n in fixture_names() for c in cases(n, "fail") for m in MODES]


@pytest.mark.parametrize("name,case,mode", ok_params())
def test_fixture_matches_tvm(name, case, mode, build_dir):
    folder = os.path.join(FIXTURES, name)
    second = os.path.join(folder, f"ok_{case}.out2.npz")
    stateful = os.path.exists(second)
    so = build(name, mode, build_dir, copy=f"{case}" if stateful else None)
    main = tvm_ffi.load_module(so)["main"]
    args = load_args(os.path.join(folder, f"ok_{case}.in.npz"))
    assert_bitwise(flatten(main(*args), []), os.path.join(folder, f"ok_{case}.out.npz"))
    if stateful:
        assert_bitwise(flatten(main(*args), []), second)


# TVM's error kinds as tvm-ffi raises them in Python.
PYTHON_KIND = {
    "InternalError": RuntimeError,
    "ValueError": ValueError,
    "TypeError": TypeError,
    "RuntimeError": RuntimeError,
    "AssertionError": AssertionError,
    "IndexError": IndexError,
}


@pytest.mark.parametrize("name,case,mode", fail_params())
def test_fixture_errors_match_tvm(name, case, mode, build_dir):
    folder = os.path.join(FIXTURES, name)
    kind, message = open(os.path.join(folder, f"fail_{case}.err")).read().split("\n", 1)
    message = message.rstrip("\n")
    main = tvm_ffi.load_module(build(name, mode, build_dir))["main"]
    with pytest.raises(Exception) as info:
        main(*load_args(os.path.join(folder, f"fail_{case}.in.npz")))
    expected_class = (
        PYTHON_KIND.get(kind, RuntimeError) if kind != "InternalError" else (RuntimeError, ValueError, TypeError)
    )
    assert isinstance(info.value, expected_class), f"{type(info.value).__name__} for TVM's {kind}"
    ours = str(info.value)
    if ours.startswith("in ") and "): " in ours:
        ours = ours.split("): ", 1)[1]
    assert ours == message or message.endswith(": " + ours), f"{ours!r} vs TVM's {message!r}"


def test_wrong_arity_and_types_raise_the_c_api_errors(build_dir):
    main = tvm_ffi.load_module(build("mlp_static", "compiled", build_dir))["main"]
    with pytest.raises(
        TypeError, match=r"^Invoking function main expects 1 arguments \(x\), but 0 arguments were provided\.$"
    ):
        main()
    with pytest.raises(TypeError, match="expect a Tensor but get int"):
        main(3)
    x = np.zeros((2, 4), "float64")
    with pytest.raises(ValueError, match="expect Tensor with dtype float32 but get float64"):
        main(x)


def test_numpy_arrays_directly_and_misaligned_data(build_dir):
    main = tvm_ffi.load_module(build("mlp_static", "bytecode", build_dir))["main"]
    x = np.load(os.path.join(FIXTURES, "mlp_static", "ok_basic.in.npz"))["arg0"]
    want = np.load(os.path.join(FIXTURES, "mlp_static", "ok_basic.out.npz"))["out0"]
    # A numpy array passed directly, and one whose data is not 64-byte aligned.
    buf = np.zeros(x.size + 1, "float32")
    misaligned = buf[1:].reshape(x.shape)
    misaligned[...] = x
    for arg in [x, misaligned]:
        y = np.from_dlpack(main(arg))
        assert y.tobytes() == want.tobytes()


def test_results_are_zero_copy_and_outlive_the_call(build_dir):
    main = tvm_ffi.load_module(build("dyn_batch", "compiled", build_dir))["main"]
    x = np.load(os.path.join(FIXTURES, "dyn_batch", "ok_n5.in.npz"))["arg0"]
    y = main(x)
    view = np.from_dlpack(y)
    assert view.ctypes.data == y.data_ptr()
    del y
    assert view.tobytes() == np.load(os.path.join(FIXTURES, "dyn_batch", "ok_n5.out.npz"))["out0"].tobytes()


def test_two_threads_share_a_module(build_dir):
    main = tvm_ffi.load_module(build("dyn_batch", "compiled", build_dir))["main"]
    x = np.load(os.path.join(FIXTURES, "dyn_batch", "ok_n5.in.npz"))["arg0"]
    want = np.load(os.path.join(FIXTURES, "dyn_batch", "ok_n5.out.npz"))["out0"].tobytes()
    errors = []

    def work():
        try:
            for _ in range(200):
                assert np.from_dlpack(main(x)).tobytes() == want
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_two_different_models_in_one_process(build_dir):
    a = tvm_ffi.load_module(build("mlp_static", "compiled", build_dir))
    b = tvm_ffi.load_module(build("dyn_batch", "bytecode", build_dir))
    xa = np.load(os.path.join(FIXTURES, "mlp_static", "ok_basic.in.npz"))["arg0"]
    xb = np.load(os.path.join(FIXTURES, "dyn_batch", "ok_n1.in.npz"))["arg0"]
    for _ in range(3):
        assert (
            np.from_dlpack(a["main"](xa)).tobytes()
            == np.load(os.path.join(FIXTURES, "mlp_static", "ok_basic.out.npz"))["out0"].tobytes()
        )
        assert (
            np.from_dlpack(b["main"](xb)).tobytes()
            == np.load(os.path.join(FIXTURES, "dyn_batch", "ok_n1.out.npz"))["out0"].tobytes()
        )


def test_torch_tensors(build_dir):
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (pip install torch to run this test)")
    main = tvm_ffi.load_module(build("mlp_static", "compiled", build_dir))["main"]
    x = np.load(os.path.join(FIXTURES, "mlp_static", "ok_basic.in.npz"))["arg0"]
    y = torch.from_dlpack(main(torch.from_numpy(x)))
    assert y.numpy().tobytes() == np.load(os.path.join(FIXTURES, "mlp_static", "ok_basic.out.npz"))["out0"].tobytes()


@pytest.mark.parametrize("mode", MODES)
def test_external_weights_from_python(mode, build_dir):
    """tiny_llama_params takes its weights as parameters: relaxc_weights loads them (tensor cache
    or safetensors, memory-mapped once per path) as the arguments to append; embed then equals the
    bound model's (tiny_llama, the same weights) bit for bit. A broken path is an error naming it."""
    external = tvm_ffi.load_module(build("tiny_llama_params", mode, build_dir))
    bound = tvm_ffi.load_module(build("tiny_llama", mode, build_dir))
    ids = tvm_ffi.from_dlpack(np.array([1, 17, 42, 5], dtype="int32"))
    want = np.from_dlpack(bound["embed"](ids)).copy()
    params = os.path.join(FIXTURES, "tiny_llama_params")
    for path in [os.path.join(params, "tensor-cache"), os.path.join(params, "params.safetensors")]:
        weights = external["relaxc_weights"](path, "embed", 1)
        assert len(weights) == 15
        got = np.from_dlpack(external["embed"](ids, *weights))
        assert got.tobytes() == want.tobytes(), path
    with pytest.raises(Exception, match="nowhere.safetensors"):
        external["relaxc_weights"](os.path.join(params, "nowhere.safetensors"), "embed", 1)
    with pytest.raises(Exception, match="no function nope"):
        external["relaxc_weights"](os.path.join(params, "tensor-cache"), "nope", 1)
    # A truncated shard: the error names the weight and the file, as from the CLI and C.
    broken = os.path.join(build_dir, f"truncated-cache-{mode}")
    shutil.copytree(os.path.join(params, "tensor-cache"), broken, dirs_exist_ok=True)
    shard = os.path.join(broken, "params_shard_0.bin")
    os.truncate(shard, os.path.getsize(shard) - 100)
    with pytest.raises(
        Exception, match=r"weight lm_head\.weight in .*params_shard_0\.bin: .*past the end of the shard"
    ):
        external["relaxc_weights"](broken, "embed", 1)


@pytest.mark.parametrize("mode", MODES)
def test_generation_with_external_weights_from_python(mode, build_dir):
    """The whole generation from Python with the weights outside: the KV cache driven through
    relaxc_call (the library's vm.builtin.kv_state_* functions), the weights from relaxc_weights,
    tokens and logits equal to TVM's bit for bit with the tensor cache and with safetensors."""
    m = tvm_ffi.load_module(build("tiny_llama_params", mode, build_dir))
    params = os.path.join(FIXTURES, "tiny_llama_params")
    want = np.load(os.path.join(params, "generate.npz"))
    call = m["relaxc_call"]
    for path in [os.path.join(params, "tensor-cache"), os.path.join(params, "params.safetensors")]:
        w = {fn: m["relaxc_weights"](path, fn, n) for fn, n in [("embed", 1), ("prefill", 2), ("decode", 2)]}
        kv = m["create_paged_kv_cache"](*[tvm_ffi.Shape([v]) for v in [1, 128, 32, 16, 0]])
        call("vm.builtin.kv_state_add_sequence", kv, 0)

        def step(fn, ids, w=w, kv=kv):
            embeds = np.from_dlpack(m["embed"](tvm_ffi.from_dlpack(np.array(ids, "int32")), *w["embed"]))
            embeds = np.ascontiguousarray(
                embeds.reshape(1, len(ids), -1) if fn == "prefill" else embeds.reshape(len(ids), 1, -1)
            )
            call("vm.builtin.kv_state_begin_forward", kv, tvm_ffi.Shape([0]), tvm_ffi.Shape([len(ids)]))
            out = m[fn](tvm_ffi.from_dlpack(embeds), kv, *w[fn])
            call("vm.builtin.kv_state_end_forward", kv)
            return np.from_dlpack(out[0])[0, 0].copy()

        logits = [step("prefill", [int(t) for t in want["prompt"]])]
        tokens = [int(logits[-1].argmax())]
        while len(tokens) < len(want["tokens"]):
            logits.append(step("decode", [tokens[-1]]))
            tokens.append(int(logits[-1].argmax()))
        assert tokens == [int(t) for t in want["tokens"]], path
        assert np.stack(logits).tobytes() == want["logits"].tobytes(), path
    with pytest.raises(Exception, match="not registered"):
        call("vm.builtin.no_such_function")
