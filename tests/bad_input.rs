//! Bad input of every kind gets a clear error naming what is wrong and where, and never a
//! panic: damaged archives and objects, missing kernels, unknown builtins, TVM's compiled-mode
//! exports, and a bounded property test over thousands of mutated executables.
//! (Bad call arguments are covered by the differential harness's fail_* cases.)

mod common;

use common::random::Rng;

use std::io::Read;
use std::path::{Path, PathBuf};

use relaxc::codegen::ExecMode;
use relaxc::compile::{compile_file, load_tvm_export};
use relaxc::tvm;
use relaxc::vm::format;
use relaxc::vm::{Arg, ExecBuilder, Instr, VOID_REG, verify};

fn fixture(name: &str) -> PathBuf {
    common::fixtures_dir().join(name).join("m.tar")
}

/// The members of a TVM export (gzip or plain tar).
fn members(tar: &Path) -> Vec<(String, Vec<u8>)> {
    let raw = std::fs::read(tar).expect("read fixture");
    let reader: Box<dyn Read> = Box::new(flate2::read::GzDecoder::new(&raw[..]));
    let mut archive = tar::Archive::new(reader);
    let mut out = Vec::new();
    for e in archive.entries().expect("entries") {
        let mut e = e.expect("entry");
        let name = e.path().expect("path").to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).expect("member");
        out.push((name, bytes));
    }
    out
}

fn write_tar(name: &str, members: &[(String, Vec<u8>)]) -> PathBuf {
    let path = common::scratch_dir().join(format!("{name}.{}.tar", std::process::id()));
    let mut b = tar::Builder::new(std::fs::File::create(&path).expect("create tar"));
    for (n, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, n, &bytes[..]).expect("append");
    }
    b.finish().expect("finish tar");
    path
}

fn compile_err(tar: &Path) -> String {
    let out = common::scratch_dir().join(format!("bad.{}.so", std::process::id()));
    match compile_file(tar, ExecMode::Bytecode, &out) {
        Ok(_) => panic!("{} compiled, but it is broken", tar.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_archives_are_rejected() {
    let raw = std::fs::read(fixture("mlp_static")).expect("fixture");
    for cut in [0, 1, 10, 100, raw.len() / 3, raw.len() / 2, raw.len() - 20] {
        let path = common::scratch_dir().join(format!("truncated{cut}.{}.tar", std::process::id()));
        std::fs::write(&path, &raw[..cut]).expect("write");
        let e = compile_err(&path);
        let expected = format!("{} is not a readable tar archive: ", path.display());
        assert!(e.starts_with(&expected), "cut {cut}: {e}");
        let reason = if cut == 0 { "the file is empty" } else { "truncated" };
        assert!(e.contains(reason), "cut {cut}: {e}");
    }
    let path = common::scratch_dir().join(format!("garbage.{}.tar", std::process::id()));
    std::fs::write(&path, b"this is not an archive at all, just some text that goes on for a while").expect("write");
    assert!(compile_err(&path).contains("is not a readable tar archive"));
}

#[test]
fn corrupted_devc_is_rejected_with_the_offset() {
    let m = members(&fixture("mlp_static"));
    let devc = m.iter().find(|(n, _)| n == "devc.o").expect("devc.o").1.clone();
    let magic = 0xD225DE2F4214151Eu64.to_le_bytes();
    let at = devc.windows(8).position(|w| w == magic).expect("VM magic in devc.o");
    let mut bad = devc.clone();
    bad[at] ^= 0xff;
    let mut ms = m.clone();
    ms.iter_mut().find(|(n, _)| n == "devc.o").expect("devc").1 = bad;
    let e = compile_err(&write_tar("badmagic", &ms));
    assert!(e.contains("relax.VMExecutable in devc.o") && e.contains("is not a Relax VM executable"), "{e}");

    // A length field claiming more bytes than there are.
    let mut bad = devc.clone();
    let version_at = at + 8;
    bad[version_at + 7] = 0x7f;
    ms.iter_mut().find(|(n, _)| n == "devc.o").expect("devc").1 = bad;
    let e = compile_err(&write_tar("badlen", &ms));
    assert!(e.contains("header version at byte 8") && e.contains("does not fit"), "{e}");

    // Not an object file at all.
    ms.iter_mut().find(|(n, _)| n == "devc.o").expect("devc").1 = b"\x7fELF but not really".to_vec();
    assert!(compile_err(&write_tar("notelf", &ms)).contains("devc.o: not a usable object file"));
}

#[test]
fn missing_kernel_is_named_at_compile_time() {
    // mlp_static's executable with chain_1's kernels: matmul is nowhere.
    let mut ms = members(&fixture("mlp_static"));
    let lib0 = members(&fixture("chain_1")).into_iter().find(|(n, _)| n == "lib0.o").expect("lib0.o");
    ms.retain(|(n, _)| n != "lib0.o");
    ms.push(lib0);
    let e = compile_err(&write_tar("nokernel", &ms));
    assert!(
        e.contains("kernel matmul is not defined: no symbol __tvm_ffi_matmul in lib0.o (called from main at pc"),
        "{e}"
    );
}

/// A TVM-shaped export of `exec` with no kernels (devc.c + lib0.c, as TVM writes when there is no TIR).
fn export_without_kernels(name: &str, exec: &relaxc::vm::Executable) -> PathBuf {
    let blob = tvm::write_library_blob(&format::write_executable(exec));
    let bytes: Vec<String> = blob.iter().map(|b| format!("0x{b:02x}")).collect();
    let devc = format!("const unsigned char __tvm_ffi__library_bin[{}] = {{{}}};\n", blob.len(), bytes.join(","));
    write_tar(name, &[("devc.c".to_string(), devc.into_bytes()), ("lib0.c".to_string(), b";".to_vec())])
}

#[test]
fn unknown_builtin_is_named_at_compile_time() {
    let mut b = ExecBuilder::new();
    b.begin_function("main", &["x"]);
    let bogus = b.packed("vm.builtin.bogus");
    b.call(1, bogus, vec![Arg::Reg(0)]);
    b.emit(Instr::Ret { result: 1 });
    b.end_function(2);
    let e = compile_err(&export_without_kernels("bogus", &b.build()));
    assert!(e.contains("unknown builtin vm.builtin.bogus (pc 0 of main calls it)"), "{e}");
}

#[test]
fn executable_without_kernels_compiles_and_runs() {
    // The devc.c path, end to end: main(x) = make_tuple(x, x).
    let mut b = ExecBuilder::new();
    b.begin_function("main", &["x"]);
    let tuple = b.packed("vm.builtin.make_tuple");
    b.call(1, tuple, vec![Arg::Reg(0), Arg::Reg(0)]);
    b.call(VOID_REG, tuple, vec![]);
    b.emit(Instr::Ret { result: 1 });
    b.end_function(2);
    let tar = export_without_kernels("nokernels", &b.build());
    let so = common::scratch_dir().join(format!("nokernels.{}.so", std::process::id()));
    compile_file(&tar, ExecMode::Bytecode, &so).expect("compiles");
    let model = relaxc::host::Model::load(&so).expect("loads");
    let mut vm = model.vm().expect("vm");
    let out = vm.call(model.find("main").expect("main"), &[relaxc::host::Input::Int(7)]).expect("runs");
    assert_eq!(
        out.to_output(),
        relaxc::host::Output::Tuple(vec![relaxc::host::Output::Int(7), relaxc::host::Output::Int(7)])
    );
}

#[test]
fn tvm_compiled_mode_export_is_refused() {
    let tar = common::root().join("fixtures/tvm-rejected/compiled_mode.tar");
    let e = match load_tvm_export(&tar) {
        Ok(_) => panic!("accepted a compiled-mode export"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("exec_mode=\"compiled\"") && e.contains("exec_mode=\"bytecode\""), "{e}");
}

#[test]
fn mutated_executables_never_panic() {
    let seeds: Vec<Vec<u8>> =
        common::fixtures().iter().map(|f| tvm::import_tar(&f.tar()).expect("import").exec_bytes.to_vec()).collect();
    let count: usize = common::random::fuzz_count(4000);
    let mut rng = Rng::new(0x5eed_1234_abcd_0001);
    let (mut parsed, mut verified) = (0, 0);
    for _ in 0..count {
        let mut bytes = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len());
            match rng.below(4) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes[at] = 0xff,
                2 => bytes.truncate(at),
                _ => {
                    let word = (rng.next() as i64).to_le_bytes();
                    for (i, b) in word.iter().enumerate() {
                        if let Some(x) = bytes.get_mut(at + i) {
                            *x = *b;
                        }
                    }
                }
            }
            if bytes.is_empty() {
                break;
            }
        }
        let Ok(exec) = format::read_executable(&bytes) else {
            continue;
        };
        parsed += 1;
        let _ = exec.as_text();
        let _ = relaxc::vm::asm::disassemble(&exec);
        let _ = exec.stats();
        if verify(&exec).is_ok() {
            verified += 1;
            let _ = relaxc::codegen::bind_packed_functions(&exec, &Default::default(), "none");
        }
    }
    eprintln!("mutated {count} executables: {parsed} still parsed, {verified} still verified; none panicked");
    assert!(parsed > 0 && verified > 0, "the mutations never reached the verifier; the test is too blunt");
}
