//! CUDA without a GPU: every cuda/*.cu through NVRTC (CUBINs and PTX with the expected entry
//! points), the launch metadata's errors, and the CUDA model of fixtures/cuda run on a fake
//! driver that records every launch, copy and free. The GPU comparison with the CPU twin runs
//! when a CUDA driver is installed, and is reported as ignored, with the reason, when not.
//! Without NVRTC the NVRTC-dependent trials are ignored with the reason; CI (which installs
//! the nvrtc wheel) requires it.

mod common;

use relaxc::cuda::{self, Launch, nvrtc::Nvrtc};

fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "NVRTC is required in CI (.ci/run installs it): {e}");
            None
        }
    }
}

fn every_cuda_source_compiles_to_cubins_and_ptx() {
    let Some(nvrtc) = nvrtc() else { return };
    let sources = common::files_with_extension(&common::root().join("cuda"), "cu");
    assert!(sources.len() >= 3);
    let mut launches = Vec::new();
    for src in sources {
        let module = cuda::build(&nvrtc, &src, &[80, 90]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(module.images.iter().filter(|i| !i.ptx).count(), 2, "{}", src.display());
        for image in &module.images {
            if image.ptx {
                let text = String::from_utf8_lossy(&image.bytes);
                assert!(text.contains(".target sm_90"), "PTX for the newest arch");
                for k in &module.kernels {
                    assert!(text.contains(&format!(".entry {}(", k.name)), "{} missing from the PTX", k.name);
                }
            } else {
                assert!(image.bytes.starts_with(b"\x7fELF"), "a CUBIN is an ELF image");
                let elf = object::File::parse(&*image.bytes).expect("CUBIN parses");
                use object::{Object, ObjectSymbol};
                for k in &module.kernels {
                    assert!(
                        elf.symbols().any(|s| s.name() == Ok(k.name.as_str())),
                        "{} missing from sm_{}",
                        k.name,
                        image.sm
                    );
                }
            }
        }
        launches.extend(module.kernels.iter().map(|k| k.launch));
    }
    for kind in [Launch::Elementwise, Launch::Matmul, Launch::Rows] {
        assert!(launches.contains(&kind), "no kernel of kind {kind:?}");
    }
    eprintln!("NVRTC at {} built every cuda/*.cu for sm_80, sm_90 and compute_90", nvrtc.path);
}

fn bad_metadata_is_a_build_error_naming_the_kernel() {
    let cases = [
        ("extern \"C\" __global__ void k(float* o, long long n) {}\n", "no `// relaxc-kernel:` metadata"),
        ("// relaxc-kernel: k launch=diagonal inputs=1 outputs=1\n", "k: unknown launch kind `diagonal`"),
        (
            "// relaxc-kernel: k launch=matmul inputs=1 outputs=1\nextern \"C\" __global__ void k(float* a) {}\n",
            "k: launch=Matmul does not take 1 inputs",
        ),
        (
            "// relaxc-kernel: k launch=rows inputs=1 outputs=1\nextern \"C\" __global__ void k(const float* a, float* o) {}\n",
            "k: takes 2 parameters, but launch=Rows passes 4",
        ),
        (
            "// relaxc-kernel: k launch=elementwise inputs=1 outputs=1\n__global__ void k() {}\n",
            "k: the next line must declare",
        ),
    ];
    for (src, want) in cases {
        let e = cuda::parse_metadata("x.cu", src).expect_err(src).to_string();
        assert!(e.contains(want), "{e}\n(wanted: {want})");
    }
}

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The CUDA model of fixtures/cuda, built once (None when NVRTC is missing outside CI).
fn cuda_model() -> Option<&'static PathBuf> {
    cuda_model_in(relaxc::codegen::ExecMode::Bytecode)
}

fn cuda_model_in(mode: relaxc::codegen::ExecMode) -> Option<&'static PathBuf> {
    static MODELS: OnceLock<[Option<PathBuf>; 2]> = OnceLock::new();
    let models = MODELS.get_or_init(|| {
        [build_cuda_model(relaxc::codegen::ExecMode::Bytecode), build_cuda_model(relaxc::codegen::ExecMode::Compiled)]
    });
    models[(mode == relaxc::codegen::ExecMode::Compiled) as usize].as_ref()
}

fn build_cuda_model(mode: relaxc::codegen::ExecMode) -> Option<PathBuf> {
    nvrtc()?;
    let mut options = relaxc::compile::Options::mode(mode);
    options.script.kernels =
        ["vadd.cu", "matmul.cu", "rowsum.cu"].iter().map(|k| common::root().join("cuda").join(k)).collect();
    let model = common::root().join("fixtures/cuda/model.py");
    Some(common::build_with("cuda_model", &model, &options, common::mode_name(mode)).expect("build"))
}

fn fake_driver() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let out = common::scratch_dir().join(format!("fake_libcuda.{}.so", std::process::id()));
        let status = Command::new(relaxc::link::linker())
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden"])
            .arg(common::root().join("tests/c/fake_libcuda.c"))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("cc");
        assert!(status.success(), "fake_libcuda.c does not build");
        out
    })
}

/// Runs the CUDA model with `relaxc run --device cuda` on the fake driver; returns (ok, output, driver log).
fn run_on_fake(tag: &str, env: &[(&str, &str)]) -> Option<(bool, String, String)> {
    run_model_on_fake(cuda_model()?, tag, env)
}

fn run_model_on_fake(model: &PathBuf, tag: &str, env: &[(&str, &str)]) -> Option<(bool, String, String)> {
    let log = common::scratch_dir().join(format!("fake_cuda.{tag}.{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relaxc"));
    cmd.arg("run").arg(model).args(["--device", "cuda", "--inputs"]).arg(common::root().join("fixtures/cuda/in.npz"));
    cmd.env("RELAXC_LIBCUDA", fake_driver()).env("FAKE_CUDA_LOG", &log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("relaxc run");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), text, std::fs::read_to_string(&log).unwrap_or_default()))
}

fn fake_driver_sees_every_launch_and_copy() {
    for mode in [relaxc::codegen::ExecMode::Bytecode, relaxc::codegen::ExecMode::Compiled] {
        let Some(model) = cuda_model_in(mode) else { return };
        let tag = format!("ptx_{}", common::mode_name(mode));
        let Some((ok, text, log)) = run_model_on_fake(model, &tag, &[("FAKE_CUDA_SM", "100")]) else { return };
        check_fake_log(ok, &text, &log);
    }
    let listing = relaxc::inspect::cuda_listing(cuda_model().expect("built")).expect("read").expect("a CUDA listing");
    for line in
        ["image ", "sm_80 CUBIN", "sm_90 CUBIN", "compute_90 PTX", "kernel rowsum launch=Rows inputs=1 outputs=1"]
    {
        assert!(listing.contains(line), "inspect lacks `{line}`:\n{listing}");
    }
}

fn check_fake_log(ok: bool, text: &str, log: &str) {
    assert!(ok, "{text}\n{log}");
    // x, w, b go to the device; r and t come back; nothing is left allocated.
    for line in [
        "cuMemcpyHtoD buf1+0 128",
        "cuMemcpyHtoD buf2+0 96",
        "cuMemcpyHtoD buf3+0 48",
        "cuLaunchKernel matmul_tiled grid=1,1,1 block=16,16,1 shared=2048 params=buf1+0,buf2+0,buf4+0,4,3,8",
        "cuLaunchKernel vadd grid=1,1,1 block=256,1,1 shared=0 params=buf4+0,buf3+0,buf5+0,12",
        "cuLaunchKernel vrelu grid=1,1,1 block=256,1,1 shared=0 params=buf5+0,buf6+0,12",
        "cuLaunchKernel rowsum grid=4,1,1 block=256,1,1 shared=1024 params=buf6+0,buf7+0,4,3",
        "cuMemcpyDtoH buf6+0 48",
        "cuMemcpyDtoH buf7+0 16",
        "cuDevicePrimaryCtxRelease 0",
    ] {
        assert!(log.lines().any(|l| l == line), "missing `{line}` in the driver log:\n{log}");
    }
    // No CUBIN for sm_100: the PTX of every module was JIT-loaded.
    assert_eq!(log.matches("cuModuleLoadData ptx").count(), 3, "{log}");
    assert_eq!(
        log.matches("cuMemAlloc ").count(),
        log.matches("cuMemFree buf").count(),
        "leaked device memory:\n{log}"
    );
    assert_eq!(log.matches("cuModuleLoadData").count(), log.matches("cuModuleUnload").count(), "{log}");
}

fn the_cubin_for_the_device_is_chosen() {
    let Some((ok, text, log)) = run_on_fake("cubin", &[("FAKE_CUDA_SM", "80")]) else { return };
    assert!(ok, "{text}");
    assert_eq!(log.matches("cuModuleLoadData cubin").count(), 3, "{log}");
    assert!(!log.contains("cuModuleLoadData ptx"), "{log}");
}

fn driver_failures_name_the_kernel() {
    let cases = [
        (
            vec![("FAKE_CUDA_FAIL", "cuLaunchKernel")],
            "kernel matmul_tiled: cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED (unspecified launch failure)",
        ),
        (vec![("FAKE_CUDA_FAIL", "cuMemAlloc_v2")], "cuMemAlloc of device storage: CUDA_ERROR_OUT_OF_MEMORY"),
        (vec![("FAKE_CUDA_SM", "75")], "kernel matmul_tiled: no CUBIN for sm_75 and no PTX this device can run"),
        (vec![("FAKE_CUDA_DEVICES", "0")], "CUDA device 0 requested, but the machine has 0"),
        (
            vec![("RELAXC_LIBCUDA", "/nonexistent/libcuda.so.1")],
            "cannot load the CUDA driver /nonexistent/libcuda.so.1",
        ),
    ];
    for (i, (env, want)) in cases.into_iter().enumerate() {
        let Some((ok, text, _)) = run_on_fake(&format!("fail{i}"), &env) else { return };
        assert!(!ok && text.contains(want), "{env:?}: wanted `{want}` in:\n{text}");
    }
}

/// The CPU twin: model.py with C kernels of the same names.
fn cpu_twin() -> PathBuf {
    let mut options = relaxc::compile::Options::mode(relaxc::codegen::ExecMode::Bytecode);
    options.script.kernels = vec![common::root().join("fixtures/cuda/twin_kernels.c")];
    common::build_with("cuda_twin", &common::root().join("fixtures/cuda/model.py"), &options, "cpu")
        .expect("twin builds")
}

fn cpu_models_have_no_cuda_in_them() {
    let twin = cpu_twin();
    let dynamic =
        String::from_utf8_lossy(&Command::new("readelf").arg("-d").arg(&twin).output().expect("readelf").stdout)
            .into_owned();
    assert!(!dynamic.to_lowercase().contains("cuda"), "{dynamic}");
    let symbols = String::from_utf8_lossy(&Command::new("nm").arg(&twin).output().expect("nm").stdout).into_owned();
    assert!(
        !symbols.contains("rvm_model_cuda") && !symbols.contains("rvm_cuda_kernels"),
        "a CPU model carries CUDA tables"
    );
    let dynsyms =
        String::from_utf8_lossy(&Command::new("nm").args(["-D"]).arg(&twin).output().expect("nm").stdout).into_owned();
    assert!(!dynsyms.contains(" U cu"), "a CPU model imports driver symbols:\n{dynsyms}");
    // And the twin runs; a CUDA VM on it is refused clearly.
    let model = relaxc::host::Model::load(&twin).expect("load twin");
    let inputs = relaxc::host::npz::read_inputs(&common::root().join("fixtures/cuda/in.npz")).expect("inputs");
    let mut vm = model.vm().expect("vm");
    let out = vm.call(model.find("main").expect("main"), &inputs).expect("twin runs").to_output().flatten();
    assert_eq!(out.len(), 2);
    let e = model.vm_on(2, 0).err().expect("a CUDA VM on a CPU model").to_string();
    assert!(e.contains("this model has no CUDA kernels"), "{e}");
}

fn gpu_outputs_match_the_cpu_twin() {
    let Some(model) = cuda_model() else { return };
    let inputs = relaxc::host::npz::read_inputs(&common::root().join("fixtures/cuda/in.npz")).expect("inputs");
    let twin = relaxc::host::Model::load(&cpu_twin()).expect("twin");
    let want =
        twin.vm().expect("vm").call(twin.find("main").expect("main"), &inputs).expect("twin").to_output().flatten();
    let gpu = relaxc::host::Model::load(model).expect("load");
    let got = gpu
        .vm_on(2, 0)
        .expect("cuda vm")
        .call(gpu.find("main").expect("main"), &inputs)
        .expect("gpu")
        .to_output()
        .flatten();
    // Tolerance: the GPU contracts multiply-adds (FMA) and sums rows as a tree: 1e-4 relative.
    for (g, w) in got.iter().zip(&want) {
        let (relaxc::host::Output::Tensor { data: gd, .. }, relaxc::host::Output::Tensor { data: wd, .. }) = (g, w)
        else {
            panic!("tensors")
        };
        for (a, b) in gd.chunks_exact(4).zip(wd.chunks_exact(4)) {
            let (a, b) = (
                f32::from_le_bytes(a.try_into().unwrap_or_default()),
                f32::from_le_bytes(b.try_into().unwrap_or_default()),
            );
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "GPU {a} vs CPU {b}");
        }
    }
}

/// main(x) = to_device(x, cpu): the input goes to the device at the call and comes back through
/// vm.builtin.to_device; the fake's device memory is host memory, so the values must survive.
fn to_device_round_trips_data() {
    use relaxc::vm::{Arg, ExecBuilder, Instr};
    let Some(nvrtc) = nvrtc() else { return };
    let mut b = ExecBuilder::new();
    b.begin_function("main", &["x", "w", "b"]);
    let to_device = b.packed("vm.builtin.to_device");
    b.call(3, to_device, vec![Arg::Reg(0), Arg::Imm(1), Arg::Imm(0)]);
    b.emit(Instr::Ret { result: 3 });
    b.end_function(4);
    let cuda = vec![cuda::build(&nvrtc, &common::root().join("cuda/vadd.cu"), &[80]).expect("vadd.cu")];
    let program = relaxc::compile::Program {
        exec: relaxc::vm::Verified::new(b.build()).expect("valid"),
        kernels: Vec::new(),
        shape_funcs: Vec::new(),
        cuda,
    };
    let object = relaxc::compile::emit(&program, &relaxc::compile::Options::mode(relaxc::codegen::ExecMode::Bytecode))
        .expect("emit");
    let so = common::scratch_dir().join(format!("to_device.{}.so", std::process::id()));
    relaxc::link::link_shared(&object.link_inputs(&[]), &so).expect("link");
    let log = common::scratch_dir().join(format!("to_device.{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let out_npz = common::scratch_dir().join(format!("to_device.{}.npz", std::process::id()));
    let input = common::root().join("fixtures/cuda/in.npz");
    let x = relaxc::host::npz::read_arrays(&input).expect("inputs").remove("arg0").expect("arg0");
    let status = Command::new(env!("CARGO_BIN_EXE_relaxc"))
        .arg("run")
        .arg(&so)
        .arg("--inputs")
        .arg(&input)
        .arg("--outputs")
        .arg(&out_npz)
        .env("RELAXC_LIBCUDA", fake_driver())
        .env("FAKE_CUDA_LOG", &log)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&status.stderr).into_owned();
    assert!(status.status.success(), "{text}");
    let got = relaxc::host::npz::read_arrays(&out_npz).expect("outputs").remove("out0").expect("out0");
    assert_eq!(got.2, x.2, "the data changed on its way to the device and back");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(log.contains("cuMemcpyHtoD buf1+0 128") && log.contains("cuMemcpyDtoH buf1+0 128"), "{log}");
}

fn has_gpu_driver() -> bool {
    // SAFETY: probing whether a CUDA driver is installed; nothing from it is called here.
    unsafe { libloading::Library::new("libcuda.so.1") }.is_ok()
}

fn main() {
    use libtest_mimic::{Arguments, Completion, Trial};
    let args = Arguments::from_args();
    let needs_nvrtc = |name: &'static str, f: fn()| {
        Trial::ignorable_test(name, move || {
            if nvrtc().is_none() {
                return Ok(Completion::ignored_with("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12)"));
            }
            f();
            Ok(Completion::Completed)
        })
    };
    let trials = vec![
        needs_nvrtc("every_cuda_source_compiles_to_cubins_and_ptx", every_cuda_source_compiles_to_cubins_and_ptx),
        Trial::test("bad_metadata_is_a_build_error_naming_the_kernel", || {
            bad_metadata_is_a_build_error_naming_the_kernel();
            Ok(())
        }),
        needs_nvrtc("fake_driver_sees_every_launch_and_copy", fake_driver_sees_every_launch_and_copy),
        needs_nvrtc("the_cubin_for_the_device_is_chosen", the_cubin_for_the_device_is_chosen),
        needs_nvrtc("driver_failures_name_the_kernel", driver_failures_name_the_kernel),
        needs_nvrtc("to_device_round_trips_data", to_device_round_trips_data),
        Trial::test("cpu_models_have_no_cuda_in_them", || {
            cpu_models_have_no_cuda_in_them();
            Ok(())
        }),
        Trial::ignorable_test("gpu::outputs_match_the_cpu_twin", || {
            if !has_gpu_driver() {
                return Ok(Completion::ignored_with("GPU test skipped: no CUDA driver (libcuda.so.1) on this machine"));
            }
            if nvrtc().is_none() {
                return Ok(Completion::ignored_with("GPU test skipped: NVRTC not found"));
            }
            gpu_outputs_match_the_cpu_twin();
            Ok(Completion::Completed)
        }),
    ];
    libtest_mimic::run(&args, trials).exit();
}
