//! Regression tests for the hardening pass: sizes that would wrap are errors in both modes,
//! `.npz` headers are not trusted, and arrays numpy writes in Fortran order or big-endian are
//! converted. Each case here once crashed, aborted, or returned a tensor smaller than its shape.

mod common;

use std::io::Write;

use relaxc::abi::DLDataType;
use relaxc::codegen::ExecMode;
use relaxc::host::{HostTensor, Input, Model, Output, npz};
use relaxc::vm::{Arg, ExecBuilder, Instr};

const F32: DLDataType = DLDataType { code: 2, bits: 32, lanes: 1 };
const MODES: [ExecMode; 2] = [ExecMode::Bytecode, ExecMode::Compiled];

fn f32_tensor(shape: &[i64]) -> Input {
    let n: i64 = shape.iter().product();
    let data: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    Input::Tensor(HostTensor::new(F32, shape.to_vec(), &data))
}

fn call_err(model: &Model, inputs: &[Input]) -> String {
    let mut vm = model.vm().expect("vm");
    match vm.call(model.find("main").expect("main"), inputs) {
        Ok(v) => panic!("the call succeeded with {:?}", v.to_output()),
        Err(e) => e.to_string(),
    }
}

/// The script fixture `shapes` allocates `iota` of shape (a*b, m) with m from an R.Shape
/// argument: 4 * 2^62 wrapped to 0 bytes (the kernel then wrote through it), 4 * (2^62 + 1) to
/// 16 bytes (a result of shape (4, 2^62 + 1) over 16 bytes, rc 0).
#[test]
fn shape_products_that_overflow_are_errors() {
    let fixture = common::script_fixtures().into_iter().find(|f| f.name == "shapes").expect("shapes fixture");
    for mode in MODES {
        let model = Model::load(&fixture.build(mode).expect("builds")).expect("loads");
        for m in [1i64 << 62, (1 << 62) + 1] {
            let e = call_err(&model, &[f32_tensor(&[2, 2]), Input::Shape(vec![m]), Input::Int(2)]);
            assert!(
                e.contains("vm.builtin.alloc_tensor") && e.contains("would have more than 2^63 bytes"),
                "{mode:?}, m = {m}: {e}"
            );
        }
        // The storage size (a * b * m * 4, wrapping as TVM's shape functions do) turns negative.
        let e = call_err(&model, &[f32_tensor(&[2, 2]), Input::Shape(vec![i64::MAX]), Input::Int(2)]);
        assert!(e.contains("vm.builtin.alloc_storage: negative size -16 bytes"), "{mode:?}: {e}");
        let e = call_err(&model, &[f32_tensor(&[2, 2]), Input::Shape(vec![-3]), Input::Int(2)]);
        assert!(e.contains("negative"), "{mode:?}: {e}");
    }
}

/// main(x, s) = reshape(x, s): a new shape whose byte size wraps passed the view check.
#[test]
fn reshape_to_a_wrapping_shape_is_an_error() {
    let mut b = ExecBuilder::new();
    b.begin_function("main", &["x", "s"]);
    let reshape = b.packed("vm.builtin.reshape");
    b.call(2, reshape, vec![Arg::Reg(0), Arg::Reg(1)]);
    b.emit(Instr::Ret { result: 2 });
    b.end_function(3);
    let program = relaxc::compile::Program {
        exec: relaxc::vm::Verified::new(b.build()).expect("valid"),
        kernels: Vec::new(),
        shape_funcs: Vec::new(),
        cuda: Vec::new(),
    };
    for mode in MODES {
        let so = common::link_program("reshape", &program, mode).expect("build");
        let model = Model::load(&so).expect("loads");
        for shape in [vec![1i64 << 62, 4], vec![1 << 62, 1 << 62], vec![4, -1]] {
            let e = call_err(&model, &[f32_tensor(&[4]), Input::Shape(shape.clone())]);
            assert!(e.contains("vm.builtin.reshape"), "{mode:?} {shape:?}: {e}");
        }
        // A reshape that fits still works.
        let mut vm = model.vm().expect("vm");
        let out =
            vm.call(model.find("main").expect("main"), &[f32_tensor(&[4]), Input::Shape(vec![2, 2])]).expect("fits");
        assert!(matches!(out.to_output(), Output::Tensor { ref shape, .. } if *shape == [2, 2]));
    }
}

/// An `.npy` image: numpy's version-1 header with this descriptor, order and shape, then `data`.
fn npy(descr: &str, fortran: bool, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let order = if fortran { "True" } else { "False" };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes an `.npz` of these (name, npy) entries, deflated or stored.
fn npz_file(tag: &str, entries: &[(&str, Vec<u8>)], deflate: bool) -> std::path::PathBuf {
    let path = common::scratch_dir().join(format!("{tag}.{}.npz", std::process::id()));
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).expect("create npz"));
    let method = if deflate { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in entries {
        zip.start_file(format!("{name}.npy"), options).expect("entry");
        zip.write_all(bytes).expect("write");
    }
    zip.finish().expect("finish");
    path
}

fn npz_err(tag: &str, entries: &[(&str, Vec<u8>)], deflate: bool) -> String {
    match npz::read_inputs(&npz_file(tag, entries, deflate)) {
        Ok(inputs) => panic!("{tag}: read {} inputs from a broken file", inputs.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn npz_headers_are_checked_before_anything_is_allocated() {
    // Declared 4 TiB with no data: aborted on the allocation.
    let e = npz_err("huge", &[("arg0", npy("<f4", false, &[1 << 40], &[]))], false);
    assert!(e.contains("arg0") && e.contains("needs 4398046511104 bytes but the entry holds"), "{e}");
    // 2^62 x 16 float32: the byte count wrapped and a kernel read past the data.
    let e = npz_err("wrap", &[("arg0", npy("<f4", false, &[1 << 62, 16], &[]))], false);
    assert!(e.contains("overflows a 64-bit byte count"), "{e}");
    // (2^64 - 1, 16): "capacity overflow" panic.
    let e = npz_err("max", &[("arg0", npy("<f4", false, &[u64::MAX, 16], &[]))], false);
    assert!(e.contains("larger than an int64"), "{e}");
    // A dim of 2^63 read as negative.
    let e = npz_err("neg", &[("arg0", npy("<f4", false, &[1 << 63], &[]))], false);
    assert!(e.contains("dimension 0 (9223372036854775808) is larger than an int64"), "{e}");
    // A shape argument with a negative dim.
    let e = npz_err("negshape", &[("arg0.shape", npy("<i8", false, &[1], &(-2i64).to_le_bytes()))], false);
    assert!(e.contains("negative dimension (-2)"), "{e}");
    // Fewer bytes than the shape needs, deflated.
    let e = npz_err("short", &[("arg0", npy("<f4", false, &[8], &[0u8; 12]))], true);
    assert!(e.contains("needs 32 bytes"), "{e}");
}

#[test]
fn npz_decompression_stops_at_the_declared_array() {
    // 64 MiB of zeros after a 16-byte array deflate to ~64 KiB; only the array is read.
    let mut bytes = npy("<f4", false, &[4], &[0u8; 16]);
    bytes.resize(bytes.len() + (64 << 20), 0);
    let path = npz_file("bomb", &[("arg0", bytes)], true);
    assert!(std::fs::metadata(&path).expect("npz").len() < 1 << 20);
    let inputs = npz::read_inputs(&path).expect("reads");
    let [Input::Tensor(t)] = &inputs[..] else { panic!("one tensor") };
    assert_eq!((t.shape.as_slice(), t.data.as_slice().len()), (&[4i64][..], 16));
}

#[test]
fn npz_fortran_order_and_big_endian_arrays_are_converted() {
    // [[0, 1, 2], [3, 4, 5]] as numpy stores it in Fortran order: column by column.
    let column_major: Vec<u8> = [0f32, 3., 1., 4., 2., 5.].iter().flat_map(|v| v.to_le_bytes()).collect();
    let big_endian: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_be_bytes()).collect();
    let big_shape: Vec<u8> = [2i64, 3].iter().flat_map(|v| v.to_be_bytes()).collect();
    let path = npz_file(
        "convert",
        &[
            ("arg0", npy("<f4", true, &[2, 3], &column_major)),
            ("arg1", npy(">f4", false, &[2], &big_endian)),
            ("arg2.shape", npy(">i8", false, &[2], &big_shape)),
        ],
        false,
    );
    let inputs = npz::read_inputs(&path).expect("reads");
    let floats = |t: &HostTensor| -> Vec<f32> {
        t.data.as_slice().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
    };
    let [Input::Tensor(a), Input::Tensor(b), Input::Shape(s)] = &inputs[..] else { panic!("tensor, tensor, shape") };
    assert_eq!((a.shape.as_slice(), floats(a)), (&[2i64, 3][..], vec![0., 1., 2., 3., 4., 5.]));
    assert_eq!(floats(b), vec![1.5, -2.0]);
    assert_eq!(s, &vec![2, 3]);
}

/// The model's weight loader (rvm.h's weights_open) reads files from outside: 400 randomly
/// damaged tensor-cache indexes and safetensors headers (bytes flipped, cut, repeated) must each
/// load or fail with a message, never crash (this file also runs under AddressSanitizer), and
/// weights that load give arguments or an error.
#[test]
fn damaged_weight_files_never_crash_the_loader() {
    let dir = common::fixtures_dir().join("tiny_llama_params");
    let so = common::build("tiny_llama_params", &dir.join("m.tar"), ExecMode::Bytecode).expect("build");
    let model = Model::load(&so).expect("load");
    let prefill = model.find("prefill").expect("prefill");
    let index = std::fs::read(dir.join("tensor-cache/tensor-cache.json")).expect("index");
    let shard = std::fs::read(dir.join("tensor-cache/params_shard_0.bin")).expect("shard");
    let safetensors = std::fs::read(dir.join("params.safetensors")).expect("safetensors");
    let scratch = tempfile::tempdir().expect("tempdir");
    std::fs::write(scratch.path().join("params_shard_0.bin"), &shard).expect("shard");
    let mut state = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut loaded, mut refused) = (0, 0);
    for round in 0..400 {
        let safetensors_round = round % 2 == 1;
        let mut bytes =
            if safetensors_round { safetensors[..(8 + 1200).min(safetensors.len())].to_vec() } else { index.clone() };
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % bytes.len().max(1);
            match next() % 4 {
                0 => bytes[at] = next() as u8,
                1 => bytes.truncate(at),
                2 => bytes.insert(at, b"{}[]\",:0123456789-e"[(next() % 19) as usize]),
                _ => {
                    let piece: Vec<u8> = bytes[at..].iter().take(16).copied().collect();
                    bytes.splice(at..at, piece);
                }
            }
        }
        let path = if safetensors_round {
            let mut whole = bytes.clone();
            if whole.len() >= 8 + 1200 {
                whole.extend_from_slice(&safetensors[8 + 1200..]);
            }
            let p = scratch.path().join("w.safetensors");
            std::fs::write(&p, whole).expect("write");
            p
        } else {
            std::fs::write(scratch.path().join("tensor-cache.json"), &bytes).expect("write");
            scratch.path().to_path_buf()
        };
        match relaxc::host::external::Weights::load(&model, &path) {
            Ok(w) => {
                loaded += 1;
                let _ = w.arguments(prefill, 2);
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    eprintln!("damaged weight files: {loaded} loaded, {refused} refused with a message");
    assert!(refused > 0, "no damage was noticed: the test damages nothing");
}
