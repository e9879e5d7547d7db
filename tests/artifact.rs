//! Properties of the built artifact: it exports only the C API, depends on nothing beyond the
//! C library, the runtime shim stays small, and the layouts shared between C and Rust agree.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use relaxc::abi;
use relaxc::codegen::ExecMode;

fn model() -> std::path::PathBuf {
    common::build("mlp_static", &common::fixtures_dir().join("mlp_static/m.tar"), ExecMode::Bytecode).expect("build")
}

fn tool(cmd: &str, args: &[&str], so: &std::path::Path) -> String {
    let out = Command::new(cmd).args(args).arg(so).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A model exports the C API's entry point and one tvm-ffi entry per Relax function: no kernel,
/// no runtime symbol (so models do not clash in one process).
#[test]
fn exports_only_the_c_api_and_tvm_ffi_entries() {
    for (name, functions) in [("mlp_static", vec!["main"]), ("calls", vec!["helper", "main", "main_inner"])] {
        let tar = common::fixtures_dir().join(name).join("m.tar");
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let so = common::build(name, &tar, mode).expect("build");
            let text = tool("nm", &["-D", "--defined-only"], &so);
            let mut names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
            names.sort();
            let mut want: Vec<String> = functions.iter().map(|f| format!("__tvm_ffi_{f}")).collect();
            // The runtime's own entries for Python (ffi_module.c).
            want.push(abi::FFI_WEIGHTS_SYMBOL.into());
            want.push(abi::FFI_CALL_SYMBOL.into());
            want.push("rvm_get_api".into());
            want.sort();
            assert_eq!(names, want, "{name} ({})", common::mode_name(mode));
        }
    }
}

#[test]
fn needs_only_the_c_library() {
    let text = tool("readelf", &["-d"], &model());
    let allowed = ["libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0"];
    for line in text.lines().filter(|l| l.contains("(NEEDED)")) {
        let lib = line.split('[').nth(1).and_then(|s| s.strip_suffix(']')).unwrap_or(line);
        assert!(allowed.contains(&lib), "unexpected dependency {lib}");
    }
    assert!(!text.contains("TEXTREL"), "the model needs text relocations");
}

/// Bytes of code and of data in each member of an archive, by member name.
fn archive_sizes(bytes: &[u8]) -> Vec<(String, u64, u64)> {
    use object::{Object, ObjectSection, SectionKind};
    let archive = object::read::archive::ArchiveFile::parse(bytes).expect("archive");
    let mut out = Vec::new();
    for member in archive.members() {
        let member = member.expect("member");
        let file = object::File::parse(member.data(bytes).expect("member data")).expect("object");
        let (mut code, mut data) = (0u64, 0u64);
        for s in file.sections() {
            match s.kind() {
                SectionKind::Text => code += s.size(),
                SectionKind::Data
                | SectionKind::ReadOnlyData
                | SectionKind::ReadOnlyString
                | SectionKind::UninitializedData => data += s.size(),
                _ => {}
            }
        }
        out.push((String::from_utf8_lossy(member.name()).into_owned(), code, data));
    }
    out
}

/// The core every model links stays within the 64 KiB of code decision 1 sets
/// (docs/src/architecture/decisions.md); the optional runtime functions are reported file by file (a model links those it uses).
#[test]
fn runtime_shim_size() {
    let core = archive_sizes(relaxc::target::shim::HOST_SHIM_ARCHIVE);
    let (code, data): (u64, u64) = core.iter().fold((0, 0), |(c, d), m| (c + m.1, d + m.2));
    eprintln!("runtime shim core: {code} bytes of code, {data} bytes of data");
    for (name, code, data) in archive_sizes(relaxc::target::shim::HOST_RUNTIME_ARCHIVE) {
        eprintln!("  optional {name}: {code} bytes of code, {data} bytes of data");
    }
    assert!(code > 0 && code <= 64 * 1024, "the shim core's code ({code} bytes) is over the 64 KiB goal");
}

/// A model links the optional runtime files it uses and no others.
#[test]
fn models_link_only_the_runtime_functions_they_use() {
    let defined = |so: &Path| -> String {
        let out = Command::new("nm").arg(so).output().expect("nm");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let fixtures = common::fixtures_dir();
    let mlp = common::build("mlp_static", &fixtures.join("mlp_static/m.tar"), ExecMode::Compiled).expect("mlp");
    let symbols = defined(&mlp);
    for absent in ["rvm_builtin_kv_create", "rvm_builtin_sort_topk", "rvm_builtin_run_print"] {
        assert!(!symbols.contains(absent), "mlp_static links {absent}");
    }
    // Bytecode calls pull their file in; so do the names a kernel looks up.
    let llm = common::build("tiny_llama", &fixtures.join("tiny_llama/m.tar"), ExecMode::Compiled).expect("llm");
    let symbols = defined(&llm);
    assert!(symbols.contains("rvm_builtin_kv_begin") && !symbols.contains("rvm_builtin_sort_topk"));
    let topk = common::build("onnx_topk", &fixtures.join("onnx_topk/m.tar"), ExecMode::Compiled).expect("topk");
    let symbols = defined(&topk);
    assert!(symbols.contains("rvm_builtin_sort_topk") && !symbols.contains("rvm_builtin_kv_create"));
}

#[test]
fn shared_layouts_agree_between_c_and_rust() {
    // A probe printing, with the C compiler's own sizeof/offsetof, every field and constant that
    // relaxc::abi mirrors; any field moved on either side shows up as a difference.
    let structs = abi::c_structs();
    let constants = abi::c_constants();
    let mut probe = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"internal.h\"\n#include \"rk.h\"\nint main(void) {\n",
    );
    for s in &structs {
        probe.push_str(&format!("  printf(\"{0} %zu\\n\", sizeof({0}));\n", s.c_name));
        for (field, _) in &s.fields {
            probe.push_str(&format!("  printf(\"{0}.{1} %zu\\n\", offsetof({0}, {1}));\n", s.c_name, field));
        }
    }
    for (name, _) in &constants {
        probe.push_str(&format!("  printf(\"{name} %llu\\n\", (unsigned long long)({name}));\n"));
    }
    probe.push_str("  return 0;\n}\n");
    let dir = common::scratch_dir();
    let source = dir.join(format!("abi_probe.{}.c", std::process::id()));
    std::fs::write(&source, probe).expect("write the probe");
    let exe = dir.join(format!("abi_probe.{}", std::process::id()));
    let status = Command::new(relaxc::link::linker())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(common::root().join("runtime-shim/include"))
        .arg("-I")
        .arg(common::root().join("runtime-shim/src"))
        .arg("-I")
        .arg(common::root().join("runtime-kernels/include"))
        .arg("-I")
        .arg(common::root().join("runtime-kernels/src"))
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cc");
    assert!(status.success(), "the layout probe does not build");
    let out = Command::new(&exe).output().expect("run probe");
    let c: HashMap<String, u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_string(), v.parse().expect("number"))))
        .collect();
    let mut rust: Vec<(String, u64)> = Vec::new();
    for s in &structs {
        rust.push((s.c_name.to_string(), s.size as u64));
        rust.extend(s.fields.iter().map(|(f, at)| (format!("{}.{f}", s.c_name), *at as u64)));
    }
    rust.extend(constants.iter().map(|(name, v)| (name.to_string(), *v)));
    let differ: Vec<String> = rust
        .iter()
        .filter(|(name, value)| c.get(name) != Some(value))
        .map(|(name, value)| format!("{name}: C says {:?}, relaxc::abi says {value}", c.get(name)))
        .collect();
    assert!(differ.is_empty(), "layouts shared with the shim differ:\n{}", differ.join("\n"));
    assert_eq!(c.len(), rust.len());
    // Sanity: the probe covers the tables, objects, values and API (not a vacuous pass).
    assert!(rust.len() > 100, "only {} entries checked", rust.len());
}

#[test]
fn every_function_of_every_fixture_compiles_natively() {
    for f in common::fixtures() {
        let so = common::build(&f.name, &f.tar(), ExecMode::Compiled).expect("build");
        let symbols = tool("nm", &[], &so);
        let modes = relaxc::inspect::function_modes(&so).expect("read").expect("modes section");
        assert!(!modes.is_empty(), "{}: no Relax functions listed", f.name);
        for (name, compiled) in modes {
            assert!(compiled, "{}: {name} fell back to bytecode", f.name);
            let symbol = format!(" __vmtir__{name}\n");
            assert!(symbols.contains(&symbol), "{}: nm shows no __vmtir__{name}", f.name);
        }
    }
}

/// `--emit-clif` heads each bytecode instruction's code with `; pc=N <listing line>`: every
/// reachable instruction of every compiled function appears, with the listing's own text.
#[test]
fn emitted_clif_carries_the_bytecode_pc() {
    for name in ["if_cond", "calls", "mlp_static"] {
        let tar = common::fixtures_dir().join(format!("{name}/m.tar"));
        let mut options = relaxc::compile::Options::mode(ExecMode::Compiled);
        options.native.emit_clif = true;
        let out = common::scratch_dir().join(format!("{name}.clif.{}.so", std::process::id()));
        let report = relaxc::compile::compile_file_with(&tar, &options, &out).expect("compile");
        let exec = relaxc::tvm::import_tar(&tar).expect("import").exec;
        for f in exec.funcs.iter().filter(|f| f.kind == relaxc::vm::FuncKind::Bytecode) {
            let header = format!("; __vmtir__{}: Relax function {}, pc 0..", f.name, f.name);
            let at = report.clif.find(&header).unwrap_or_else(|| panic!("{name}: no CLIF for {}", f.name));
            let end = report.clif[at + 1..].find("\n; __vmtir__").map_or(report.clif.len(), |e| at + 1 + e);
            let body = &report.clif[at..end];
            assert!(body.contains("function "), "{name}/{}: no function text", f.name);
            for pc in 0..f.end_instr - f.start_instr {
                let instr = exec.instr((f.start_instr + pc) as usize).expect("instruction");
                let comment = format!("; pc={pc} {}\n", exec.instr_text(&instr));
                // A stack tensor proven at compile time, and the kill of one, may need no code.
                let may_vanish = matches!(&instr, relaxc::vm::Instr::Call { func, .. }
                    if ["vm.builtin.alloc_tensor", "vm.builtin.null_value"].contains(&exec.funcs[*func as usize].name.as_str()));
                let tagged = body.contains(&format!("; pc={pc} "));
                assert!(tagged || may_vanish, "{name}/{}: missing `{}`\n{body}", f.name, comment.trim_end());
                assert!(
                    !tagged || body.contains(&comment),
                    "{name}/{}: `{}` has other text\n{body}",
                    f.name,
                    comment.trim_end()
                );
            }
            // The machine-code summary accounts for every instruction's bytes.
            let summary = body.lines().find(|l| l.starts_with("; machine code: ")).expect("size summary");
            let numbers: Vec<u64> =
                summary.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
            let [total, inside, count, outside] = numbers[..] else { panic!("{summary}") };
            // A goto that became a fall-through has no bytes of its own.
            assert!(count >= 1 && count <= (f.end_instr - f.start_instr) as u64, "{name}/{}: {summary}", f.name);
            assert!(inside > 0 && inside + outside == total, "{name}/{}: {summary}", f.name);
            let beyond = format!("; pc={} ", f.end_instr - f.start_instr);
            assert!(!body.contains(&beyond), "{name}/{}: a pc past the end", f.name);
        }
    }
}

/// The CLIF compiled mode makes for a few fixtures (for x86-64, with the machine-code summary),
/// kept as golden files in `fixtures/clif/` (`RELAXC_BLESS=1` rewrites them): a change to code
/// generation shows up as a readable diff of the code it makes.
#[test]
fn clif_listings_match_their_golden_files() {
    let mut failures = Vec::new();
    for name in ["if_cond", "calls", "mlp_static"] {
        let program =
            relaxc::compile::load_tvm_export(&common::fixtures_dir().join(format!("{name}/m.tar"))).expect("fixture");
        let mut options = relaxc::compile::Options::mode(ExecMode::Compiled);
        options.native.emit_clif = true;
        options.target = relaxc::target::Target::parse("x86_64-unknown-linux-gnu").expect("x86-64");
        let object = relaxc::compile::emit(&program, &options).expect("emit");
        assert!(object.clif.contains("function "), "{name}: no CLIF");
        let golden = common::root().join(format!("fixtures/clif/{name}.clif"));
        if let Err(diff) = common::check_golden(&golden, &object.clif) {
            failures.push(diff);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Compiled mode's code per operator on chain_1000 (a load of straight-line kernel calls on
/// stack tensors) stays small: the whole function is streamed through the instruction cache on
/// every call. And compiling on several threads gives the very same object as on one.
#[test]
fn compiled_code_is_small_and_the_same_on_any_number_of_threads() {
    use object::{Object, ObjectSymbol};
    let program = relaxc::compile::load_tvm_export(&common::fixtures_dir().join("chain_1000/m.tar")).expect("fixture");
    let mut objects = Vec::new();
    for jobs in [1, 2, 3] {
        let mut options = relaxc::compile::Options::mode(ExecMode::Compiled);
        options.native.jobs = jobs;
        objects.push(relaxc::compile::emit(&program, &options).expect("emit").bytes);
    }
    assert!(objects.windows(2).all(|w| w[0] == w[1]), "the object depends on the number of threads");
    let file = object::File::parse(&*objects[0]).expect("object");
    let code: u64 =
        file.symbols().filter(|s| s.name().is_ok_and(|n| n.starts_with("__vmtir__"))).map(|s| s.size()).sum();
    let per_op = code as f64 / 1000.0;
    eprintln!("chain_1000 compiled: {code} bytes of native code, {per_op:.0} per operator");
    assert!(per_op <= 150.0, "{per_op:.0} bytes of native code per operator (at most 150 wanted)");
}

/// A chain writing into one buffer and then the other alternates between two argument lists:
/// compiled mode keeps one argument array for each, so once both are filled a kernel call into
/// a stack tensor stores nothing at all (its CLIF is the call and its error branch).
#[test]
fn alternating_calls_find_their_arguments_already_staged() {
    let program = relaxc::compile::load_tvm_export(&common::fixtures_dir().join("chain_100/m.tar")).expect("fixture");
    for roll_loops in [false, true] {
        let mut options = relaxc::compile::Options::mode(ExecMode::Compiled);
        options.native.emit_clif = true;
        options.native.roll_loops = roll_loops;
        let object = relaxc::compile::emit(&program, &options).expect("emit");
        let segments: Vec<&str> = object.clif.split("; pc=").skip(1).collect();
        let calls: Vec<&&str> = segments.iter().filter(|s| s.contains(" call  add1 ")).collect();
        if roll_loops {
            // One loop, whose body holds two of the calls; fewer call sites than operators.
            assert_eq!(object.loops.len(), 1, "chain_100's run of stack-tensor calls is one loop");
            assert!(calls.len() < 40, "{} call sites remain with the loop", calls.len());
            // Every instruction of the body, its back edge included, stores nothing.
            let body = object.loops[0].pcs.start..object.loops[0].pcs.start + object.loops[0].period;
            let pc_of = |s: &str| s.split_whitespace().next().and_then(|pc| pc.parse::<usize>().ok());
            let in_body: Vec<&&str> =
                segments.iter().filter(|s| pc_of(s).is_some_and(|pc| body.contains(&pc))).collect();
            // Instructions that need no code (a view the slot already holds, a virtual kill) have no
            // segment; the two calls do.
            let body_calls = in_body.iter().filter(|s| s.contains(" call  add1 ")).count();
            assert_eq!(body_calls, 2, "one copy of each of the body's calls");
            for code in in_body {
                let code = code.split("; machine code").next().unwrap_or(code);
                assert!(!code.contains("store "), "the loop's body stores:\n{code}");
            }
        } else {
            assert!(object.loops.is_empty());
            assert_eq!(calls.len(), 100, "chain_100 has 100 kernel calls");
        }
        // The last three write into tensors checked at run time and held in registers (TVM's plan
        // releases their storage right after them, and the last is the result), not stack tensors.
        // With the loop, its body (and the back edge after it) stores nothing either.
        for call in &calls[4..calls.len() - 3] {
            let code = call.split("; machine code").next().unwrap_or(call);
            assert!(!code.contains("store "), "a call whose arguments are already staged stores:\n{code}");
        }
    }
}

/// A rolled loop starts on a 64-byte boundary on x86-64 (codegen/native/align.rs): the back
/// edge of chain_100's loop jumps to an address that is a multiple of 64, and the function
/// starts on one. The loop of two calls ends within that line.
#[test]
#[cfg(target_arch = "x86_64")]
fn rolled_loops_start_on_a_fetch_boundary() {
    let tar = common::fixtures_dir().join("chain_100/m.tar");
    let so = common::build("chain_100", &tar, ExecMode::Compiled).expect("build");
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "--disassemble=__vmtir__main"])
        .arg(&so)
        .output()
        .expect("objdump (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let address = |s: &str| u64::from_str_radix(s.trim().trim_end_matches(':'), 16).ok();
    let start = text
        .lines()
        .find(|l| l.ends_with("<__vmtir__main>:"))
        .and_then(|l| address(l.split_whitespace().next().unwrap_or("")))
        .expect("__vmtir__main in the model");
    assert_eq!(start % 64, 0, "__vmtir__main starts at {start:#x}");
    // `addr: jne target <__vmtir__main+off>` (any jump), backward: the loop's back edge is the
    // shortest (cold paths, after all the function's main line, jump back into it from far).
    let back_edges: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let (at, rest) = l.split_once(':')?;
            let mut words = rest.split_whitespace();
            words.next()?.starts_with('j').then_some(())?;
            Some((address(at)?, address(words.next()?)?))
        })
        .filter(|(at, target)| target < at && *target >= start)
        .collect();
    let (at, target) =
        back_edges.into_iter().min_by_key(|(at, target)| at - target).expect("a backward jump in __vmtir__main");
    assert_eq!(target % 64, 0, "the loop's back edge at {at:#x} goes to {target:#x}");
    // Its two calls fit in that one line, back edge included (align.rs shortens it).
    let end = text
        .lines()
        .filter_map(|l| address(l.split_once(':')?.0))
        .find(|&a| a > at)
        .expect("an instruction after the back edge");
    assert!(end - target <= 64, "the loop spans {target:#x}..{end:#x}, more than one 64-byte line");
}

/// Tensor constants are stored once: their elements are in the model's data, and `.rvm_exec`
/// (which `inspect` reads) points there instead of holding a copy. The largest constant's bytes
/// occur exactly once in the file, and the executable read back from the `.so` has every
/// constant of the export, elements included, in both modes.
#[test]
fn tensor_constants_are_stored_once_and_inspect_still_reads_them() {
    for name in ["lib_mobilenet", "mlp_static", "tiny_llama"] {
        let tar = common::fixtures_dir().join(name).join("m.tar");
        let from_tar = relaxc::inspect::load_executable(&tar).expect("read the export");
        for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
            let so = common::build(name, &tar, mode).expect("build");
            let from_so = relaxc::inspect::load_executable(&so).expect("read the model");
            assert!(from_so.constants == from_tar.constants, "{name}: the model's constants differ from the export's");
            let largest = from_tar
                .constants
                .iter()
                .filter_map(|c| match c {
                    relaxc::vm::Constant::Tensor(t) => Some(&t.data),
                    _ => None,
                })
                .max_by_key(|d| d.len())
                .expect("a tensor constant");
            let needle = &largest[..largest.len().min(4096)];
            let file = std::fs::read(&so).expect("read");
            let copies = file.windows(needle.len()).filter(|w| *w == needle).count();
            assert_eq!(copies, 1, "{name}: the largest constant's bytes occur {copies} times in the model");
        }
    }
}
