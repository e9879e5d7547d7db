//! The source tree keeps its shape: each module imports only modules of lower layers (the
//! layering docs/src/architecture/overview.md states), and no function in code generation or
//! lowering grows past what a reader takes in at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;

/// Layers from the bottom. A module may use modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["abi", "diag", "outfile"],
    &["kernel_object", "vm"],
    &["ir"],
    &["script", "lower", "tvm", "weights"],
    &["target", "cuda"],
    &["kernels", "link"],
    &["codegen"],
    &["compile", "inspect"],
    &["host"],
    // The binary's commands (src/cli/, modules of main.rs, not of the library): nothing in the
    // library can reach them, and they use the library only through its public paths.
    &["cli"],
];

fn layer_of(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&module))
        .unwrap_or_else(|| panic!("module {module} is missing from the layer table of tests/architecture.rs"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file under src/ belongs to (None for lib.rs and main.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_string_lossy().to_string();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// The top-level modules a file names through `crate::`, with the line of each first use.
/// `use crate::{a, b::c}` groups are read too.
fn crate_references(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                // Only the first segment of each top-level item counts: `{a::{b, c}, d}` names a, d.
                top_level_items(group)
                    .iter()
                    .map(|item| item.trim().split("::").next().unwrap_or("").to_string())
                    .collect()
            } else {
                vec![rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("").to_string()]
            };
            for name in names {
                let name = name.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_')).to_string();
                if !name.is_empty() && name != "self" {
                    out.entry(name).or_insert(n + 1);
                }
            }
        }
    }
    out
}

/// The comma-separated items of a `{...}` group (its text after the opening brace), nested
/// groups kept whole.
fn top_level_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

#[test]
fn modules_only_use_lower_layers() {
    let src = common::root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else { continue };
        let text = std::fs::read_to_string(file).expect("read");
        for (used, line) in crate_references(&text) {
            if used == module {
                continue;
            }
            if layer_of(&used) >= layer_of(&module) {
                let rel = file.strip_prefix(common::root()).expect("under root").display();
                wrong.push(format!(
                    "{rel}:{line}: {module} (layer {}) uses {used} (layer {})",
                    layer_of(&module),
                    layer_of(&used)
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "imports that do not go down a layer:\n{}", wrong.join("\n"));
}

#[test]
fn every_module_has_a_layer_and_the_check_sees_imports() {
    let lib = std::fs::read_to_string(common::root().join("src/lib.rs")).expect("lib.rs");
    let modules: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';')).collect();
    assert!(modules.len() >= 15, "{modules:?}");
    for m in &modules {
        layer_of(m);
    }
    // The reader must see grouped and plain paths, or the layering test would pass vacuously.
    let seen =
        crate_references("use crate::{abi::{self, Any}, vm};\nlet x = crate::ir::SlotExpr::Int(1); // crate::host");
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["abi", "ir", "vm"]);
}

/// Lines of each `fn` item: from its `fn` line to the closing brace at the same indentation.
fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn ", "unsafe fn ", "pub unsafe fn "]
            .iter()
            .any(|p| trimmed.starts_with(p));
        if !is_fn || trimmed.ends_with(';') {
            continue;
        }
        let name = trimmed.split("fn ").nth(1).unwrap_or("").split(['(', '<']).next().unwrap_or("").to_string();
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) =
            lines[i..].iter().position(|l| *l == close || (l.trim_start() == "}" && l.len() - 1 < indent))
        {
            out.push((name, i + 1, end + 1));
        }
    }
    out
}

#[test]
fn codegen_and_lowering_functions_stay_short() {
    const MAX_LINES: usize = 120;
    let mut files = Vec::new();
    for dir in ["src/codegen", "src/lower"] {
        rust_files(&common::root().join(dir), &mut files);
    }
    let mut long = Vec::new();
    let mut counted = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for (name, line, len) in function_lengths(&text) {
            counted += 1;
            if len > MAX_LINES {
                let rel = file.strip_prefix(common::root()).expect("under root").display();
                long.push(format!("{rel}:{line}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(counted > 50, "only {counted} functions found: the reader is broken");
    assert!(long.is_empty(), "functions over {MAX_LINES} lines:\n{}", long.join("\n"));
}

/// The command line stays a dispatcher: each command's options and implementation live in its
/// module of src/cli/, and the library never names the binary's modules.
#[test]
fn main_only_dispatches_and_cli_stays_on_top() {
    let main = std::fs::read_to_string(common::root().join("src/main.rs")).expect("main.rs");
    let lines = main.lines().count();
    assert!(lines <= 200, "src/main.rs is {lines} lines: a command's code belongs in its module of src/cli/");
    let mut files = Vec::new();
    rust_files(&common::root().join("src/cli"), &mut files);
    assert!(files.len() >= 6, "src/cli/ has {} files: one module per command", files.len());
    let mut library = Vec::new();
    rust_files(&common::root().join("src"), &mut library);
    for file in library.iter().filter(|f| !f.starts_with(common::root().join("src/cli"))) {
        let text = std::fs::read_to_string(file).expect("read");
        assert!(!crate_references(&text).contains_key("cli"), "{} uses the binary's cli module", file.display());
    }
}

/// No source file grows past what a reader takes in at once, unless its opening paragraph says
/// why it should stay whole (with the words "stays whole").
#[test]
fn source_files_stay_readable() {
    const MAX_LINES: usize = 700;
    let mut files = Vec::new();
    rust_files(&common::root().join("src"), &mut files);
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let lines = text.lines().count();
        let opening: String = text.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join(" ");
        if lines > MAX_LINES && !opening.contains("stays whole") {
            long.push(format!("{} is {lines} lines", file.strip_prefix(common::root()).expect("under root").display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines whose opening does not say why they stay whole:\n{}",
        long.join("\n")
    );
}
