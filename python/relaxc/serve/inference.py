"""Tensor models over the Open Inference Protocol (KServe v2): a model's signature read from its
executable's annotations (names, datatypes, shapes; -1 for a symbolic dimension), whether its
requests can be batched along a shared symbolic first dimension, and the JSON requests and
responses, with BadRequest (a 400 and its message) for anything malformed."""

import json
import re
import struct

import numpy as np

# ---- The model's signature, from its executable (.rvm_exec) --------------------------------------

_OIP_DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
_NUMPY_OF = {v: k for k, v in _OIP_DATATYPES.items()}


def _elf_section(path, wanted):
    """The bytes of one section of an ELF64 little-endian file, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file (a relaxc model)")
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, str_off, str_size = sections[shstrndx]
        f.seek(str_off)
        names = f.read(str_size)
        for name_off, _, _, _, offset, size in sections:
            end = names.find(b"\0", name_off)
            if names[name_off:end] == wanted:
                f.seek(offset)
                return f.read(size)
    return None


_CONTEXT = re.compile(
    rb"ErrorContext\(fn=([^,]+), loc=(param\[(\d+)\]|return), (?:param=([^,]+), )?annotation=(.*?)\) "
)


def _split_top(text):
    """Splits "a, b(c, d), e" at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _tensors_of(annotation):
    """The tensors of a Relax annotation, flattened: [(dims, dtype)], a symbolic dim as its name."""
    annotation = annotation.strip()
    if annotation.startswith("R.Tuple(") and annotation.endswith(")"):
        return [t for part in _split_top(annotation[len("R.Tuple(") : -1]) for t in _tensors_of(part)]
    match = re.fullmatch(r'R\.Tensor\(\((.*?)\),\s*dtype="(\w+)"\)', annotation)
    if not match:
        return [None]  # a shape, a scalar, or a tensor of unknown rank: not an OIP tensor
    dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
    return [([int(d) if re.fullmatch(r"-?\d+", d) else d for d in dims], match.group(2))]


def signature(path, function="main"):
    """Inputs and outputs of `function`: {"inputs": [(name, dims, dtype)], "outputs": [...]}, a
    symbolic dim as its name (a string); None for a value that is not a tensor."""
    exec_bytes = _elf_section(path, b".rvm_exec")
    if exec_bytes is None:
        raise ValueError(f"{path} has no .rvm_exec section: it was not built by relaxc")
    inputs, outputs = {}, None
    for m in _CONTEXT.finditer(exec_bytes):
        if m.group(1).decode() != function:
            continue
        annotation = m.group(5).decode("utf-8", "replace")
        if m.group(3) is not None:
            name = (m.group(4) or b"").decode() or f"input{m.group(3).decode()}"
            tensors = _tensors_of(annotation)
            inputs[int(m.group(3))] = (name, tensors[0] if len(tensors) == 1 else None)
        elif outputs is None:
            outputs = _tensors_of(annotation)
    return {
        "inputs": [(n, t[0], t[1]) if t else (n, None, None) for _, (n, t) in sorted(inputs.items())],
        "outputs": [(f"out{i}", t[0], t[1]) if t else (f"out{i}", None, None) for i, t in enumerate(outputs or [])],
    }


def batchable(sig):
    """Whether every input and output has the same symbolic first dimension (a batch)."""
    firsts = [dims[0] if dims else None for _, dims, _ in sig["inputs"] + sig["outputs"]]
    return bool(firsts) and isinstance(firsts[0], str) and all(f == firsts[0] for f in firsts)


# ---- Tensor models -----------------------------------------------------------------------------------


class BadRequest(Exception):
    """A request the server refuses with 400 and this message."""


def _flatten(value, out):
    import tvm_ffi

    if isinstance(value, tvm_ffi.Tensor):
        out.append(np.from_dlpack(value).copy())
    elif isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        for item in value:
            _flatten(item, out)
    elif isinstance(value, (int, float, bool)):
        out.append(np.array(value))
    else:
        raise BadRequest(f"the model returned a {type(value).__name__}, which has no tensor form")
    return out


class TensorModel:
    """A loaded tensor model: `infer` takes numpy arrays and returns the flattened results."""

    def __init__(self, path, function="main"):
        import tvm_ffi

        self.module = tvm_ffi.load_module(path)
        self.function = self.module[function]
        self.signature = signature(path, function)

    def infer(self, arrays):
        import tvm_ffi

        try:
            result = self.function(*[tvm_ffi.from_dlpack(np.ascontiguousarray(a)) for a in arrays])
        except Exception as e:
            raise BadRequest(f"{type(e).__name__}: {e}") from None
        return _flatten(result, [])


def parse_infer_request(body, sig, max_bytes):
    """The input arrays of an OIP v2 JSON inference request, in the model's parameter order."""
    if len(body) > max_bytes:
        raise BadRequest(f"request body of {len(body)} bytes is over the server's limit of {max_bytes}")
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON: {e}") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest('an inference request is a JSON object with an "inputs" list')
    given = request["inputs"]
    names = [n for n, _, _ in sig["inputs"]]
    if len(given) != len(names):
        raise BadRequest(f"the model takes {len(names)} inputs ({', '.join(names)}), the request has {len(given)}")
    by_name = {}
    for i, tensor in enumerate(given):
        if not isinstance(tensor, dict):
            raise BadRequest(f"inputs[{i}] is not a tensor object")
        name, shape, datatype, data = (tensor.get(k) for k in ("name", "shape", "datatype", "data"))
        if name not in names:
            raise BadRequest(f"inputs[{i}]: the model has no input named {name!r} (it takes {', '.join(names)})")
        if datatype not in _NUMPY_OF:
            raise BadRequest(f"input {name}: unsupported datatype {datatype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise BadRequest(f"input {name}: shape must be a list of non-negative integers")
        _, dims, dtype = sig["inputs"][names.index(name)]
        if dtype is not None and _OIP_DATATYPES.get(dtype) != datatype:
            raise BadRequest(f"input {name}: datatype {datatype}, the model takes {_OIP_DATATYPES.get(dtype, dtype)}")
        if dims is not None and (
            len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape))
        ):
            raise BadRequest(
                f"input {name}: shape {shape}, the model takes {[d if isinstance(d, int) else -1 for d in dims]}"
            )
        try:
            array = np.array(data, dtype=_NUMPY_OF[datatype])
        except (TypeError, ValueError, OverflowError) as e:
            raise BadRequest(f"input {name}: data does not fit {datatype}: {e}") from None
        if array.size != int(np.prod(shape)):
            raise BadRequest(f"input {name}: {array.size} values for shape {shape}")
        by_name[name] = array.reshape(shape)
    return [by_name[n] for n in names]


def infer_response(model_name, sig, outputs):
    tensors = []
    for i, array in enumerate(outputs):
        name = sig["outputs"][i][0] if i < len(sig["outputs"]) else f"out{i}"
        tensors.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": _OIP_DATATYPES.get(str(array.dtype), str(array.dtype)),
                "data": array.reshape(-1).tolist(),
            }
        )
    return {"model_name": model_name, "outputs": tensors}


def model_metadata(model_name, sig):
    def entry(name, dims, dtype):
        shape = [d if isinstance(d, int) else -1 for d in dims] if dims is not None else None
        return {
            "name": name,
            "datatype": _OIP_DATATYPES.get(dtype, dtype),
            "shape": shape,
        }

    return {
        "name": model_name,
        "versions": ["1"],
        "platform": "relaxc",
        "inputs": [entry(*i) for i in sig["inputs"]],
        "outputs": [entry(*o) for o in sig["outputs"]],
    }


# ---- LLMs: continuous batching on the paged KV cache ---------------------------------------------
