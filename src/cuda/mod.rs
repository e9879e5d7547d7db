//! CUDA kernels: `.cu` sources with one `// relaxc-kernel:` metadata line per kernel (the launch
//! convention of runtime-shim/include/rvm_cuda.h), compiled at model-build time by NVRTC into a
//! CUBIN per requested architecture plus PTX for the newest, all embedded in the model.

pub mod nvrtc;

use std::path::Path;

/// How grid, block, shared memory and scalar parameters follow from a call's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    Elementwise = 0,
    Matmul = 1,
    Rows = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernel {
    pub name: String,
    pub launch: Launch,
    pub inputs: usize,
    pub outputs: usize,
}

/// One compiled image: a CUBIN for `sm`, or PTX targeting `compute_<sm>`.
#[derive(Clone, Debug)]
pub struct Image {
    pub sm: u32,
    pub ptx: bool,
    pub bytes: Vec<u8>,
}

/// A compiled `.cu` file: its kernels and images.
#[derive(Clone, Debug)]
pub struct CudaModule {
    pub source: String,
    pub kernels: Vec<CudaKernel>,
    pub images: Vec<Image>,
}

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("{file}:{line}: {message}")]
    Metadata { file: String, line: usize, message: String },
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(transparent)]
    Nvrtc(#[from] nvrtc::NvrtcError),
    #[error("--cuda-arch {0}: expected an architecture like sm_80")]
    Arch(String),
}

/// Parses `--cuda-arch` values (`sm_80`, `80`).
pub fn parse_arch(s: &str) -> Result<u32, CudaError> {
    s.trim_start_matches("sm_")
        .parse::<u32>()
        .ok()
        .filter(|v| (30..=200).contains(v))
        .ok_or_else(|| CudaError::Arch(s.into()))
}

/// The kernels a source announces, checked against their declarations.
pub fn parse_metadata(file: &str, source: &str) -> Result<Vec<CudaKernel>, CudaError> {
    let err = |line: usize, message: String| CudaError::Metadata { file: file.to_string(), line, message };
    let lines: Vec<&str> = source.lines().collect();
    let mut kernels = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(meta) = line.trim().strip_prefix("// relaxc-kernel:") else { continue };
        let mut words = meta.split_whitespace();
        let name = words.next().ok_or_else(|| err(i + 1, "metadata names no kernel".into()))?.to_string();
        let (mut launch, mut inputs, mut outputs) = (None, None, None);
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| err(i + 1, format!("{name}: `{w}` is not key=value")))?;
            match k {
                "launch" => {
                    launch = Some(match v {
                        "elementwise" => Launch::Elementwise,
                        "matmul" => Launch::Matmul,
                        "rows" => Launch::Rows,
                        _ => {
                            return Err(err(
                                i + 1,
                                format!("{name}: unknown launch kind `{v}` (elementwise, matmul, rows)"),
                            ));
                        }
                    })
                }
                "inputs" | "outputs" => {
                    let n: usize = v.parse().map_err(|_| err(i + 1, format!("{name}: {k} must be a number")))?;
                    if k == "inputs" { inputs = Some(n) } else { outputs = Some(n) }
                }
                _ => return Err(err(i + 1, format!("{name}: unknown metadata key `{k}`"))),
            }
        }
        let (Some(launch), Some(inputs), Some(outputs)) = (launch, inputs, outputs) else {
            return Err(err(i + 1, format!("{name}: metadata needs launch=, inputs= and outputs=")));
        };
        let fits = match launch {
            Launch::Elementwise => outputs >= 1,
            Launch::Matmul => inputs == 2 && outputs == 1,
            Launch::Rows => inputs == 1 && outputs == 1,
        };
        if !fits {
            return Err(err(
                i + 1,
                format!("{name}: launch={launch:?} does not take {inputs} inputs and {outputs} outputs"),
            ));
        }
        // The declaration must follow, with as many parameters as the convention passes.
        let decl = lines[i + 1..].iter().map(|l| l.trim()).find(|l| !l.is_empty() && !l.starts_with("//"));
        let expected_head = format!("extern \"C\" __global__ void {name}(");
        let Some(decl) = decl.filter(|d| d.starts_with(&expected_head)) else {
            return Err(err(i + 1, format!("{name}: the next line must declare `{expected_head}...`")));
        };
        let params = decl[expected_head.len()..]
            .split(')')
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .count();
        let scalars = match launch {
            Launch::Elementwise => 1,
            Launch::Matmul => 3,
            Launch::Rows => 2,
        };
        if params != inputs + outputs + scalars {
            return Err(err(
                i + 2,
                format!(
                    "{name}: takes {params} parameters, but launch={launch:?} passes {}",
                    inputs + outputs + scalars
                ),
            ));
        }
        kernels.push(CudaKernel { name, launch, inputs, outputs });
    }
    if kernels.is_empty() {
        return Err(err(1, "no `// relaxc-kernel:` metadata: relaxc cannot launch any kernel of this file".into()));
    }
    Ok(kernels)
}

/// Compiles a `.cu` file: a CUBIN for each architecture and PTX for the newest.
pub fn build(nvrtc: &nvrtc::Nvrtc, path: &Path, archs: &[u32]) -> Result<CudaModule, CudaError> {
    let shown = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|source| CudaError::Read { path: shown.clone(), source })?;
    let kernels = parse_metadata(&shown, &source)?;
    let mut images = Vec::new();
    for &sm in archs {
        images.push(Image { sm, ptx: false, bytes: nvrtc.compile(&shown, &source, &format!("sm_{sm}"))? });
    }
    if let Some(&newest) = archs.iter().max() {
        images.push(Image {
            sm: newest,
            ptx: true,
            bytes: nvrtc.compile(&shown, &source, &format!("compute_{newest}"))?,
        });
    }
    Ok(CudaModule { source: shown, kernels, images })
}
