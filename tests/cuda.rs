//! CUDA without a GPU: every cuda/*.cu through NVRTC (CUBINs and PTX with the expected entry
//! points), and the launch metadata's errors. When NVRTC is absent the test says so and, in CI
//! (which installs the nvrtc wheel), fails.

mod common;

use relaxc::cuda::{self, Launch, nvrtc::Nvrtc};

fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::load() {
        Ok(n) => Some(n),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "NVRTC is required in CI (.ci/run installs it): {e}");
            eprintln!("SKIPPED: NVRTC tests: {e}");
            None
        }
    }
}

#[test]
fn every_cuda_source_compiles_to_cubins_and_ptx() {
    let Some(nvrtc) = nvrtc() else { return };
    let mut sources: Vec<_> = std::fs::read_dir(common::root().join("cuda"))
        .expect("cuda/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
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

#[test]
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
