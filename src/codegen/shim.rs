//! What the runtime shim offers generated code, read from the shim's own tables so that the
//! compiler and the shim cannot disagree: the builtins and runtime functions
//! (`rvm_builtins.def`, the core, and `rvm_runtime.def` and the kernel library's
//! `rvm_kernels.def`, linked only into models that use them) with the properties code generation
//! relies on, and the shim functions
//! native code calls (`rvm_calls.def`). Every Cranelift signature for a call into the shim or a
//! kernel is made here.

use std::collections::HashMap;
use std::sync::OnceLock;

use cranelift_codegen::ir::{AbiParam, Signature, Type, types};
use cranelift_module::{FuncId, Linkage, Module};

use super::CodegenError;

const CORE: &str = include_str!("../../runtime-shim/include/rvm_builtins.def");
const OPTIONAL: &str = include_str!("../../runtime-shim/include/rvm_runtime.def");
const KERNELS: &str = include_str!("../../runtime-kernels/include/rvm_kernels.def");
const CALLS: &str = include_str!("../../runtime-shim/include/rvm_calls.def");

#[derive(Clone, Debug)]
pub struct Builtin {
    /// Name bytecode uses, e.g. `vm.builtin.alloc_storage`.
    pub name: &'static str,
    /// C symbol in the shim, e.g. `rvm_builtin_alloc_storage`.
    pub symbol: String,
    pub doc: &'static str,
    /// In the optional archive: linked only into models that refer to it.
    pub optional: bool,
    /// A kernel of the kernel library (`rvm_kernels.def`), which is optional too.
    pub library: bool,
    /// Only reads its tensor arguments during the call and keeps none (`RVM_READ_ONLY`).
    pub read_only: bool,
    /// Compiled mode writes its work inline (`RVM_INLINED`).
    pub inlined: bool,
}

/// Every builtin, in table order.
pub fn builtins() -> &'static [Builtin] {
    static TABLE: OnceLock<Vec<Builtin>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let core = CORE.lines().filter_map(|l| parse_builtin(l, false, false));
        let optional = OPTIONAL.lines().filter_map(|l| parse_builtin(l, true, false));
        let library = KERNELS.lines().filter_map(|l| parse_builtin(l, true, true));
        core.chain(optional).chain(library).collect()
    })
}

/// The kernels of the kernel library, in table order.
pub fn library_kernels() -> impl Iterator<Item = &'static Builtin> {
    builtins().iter().filter(|b| b.library)
}

/// The builtin with this bytecode name.
pub fn find_builtin(name: &str) -> Option<&'static Builtin> {
    builtins().iter().find(|b| b.name == name)
}

/// `RVM_BUILTIN(suffix, "name", PROPERTIES, "doc")`, PROPERTIES being `RVM_PLAIN` or names
/// joined with `|`.
fn parse_builtin(line: &'static str, optional: bool, library: bool) -> Option<Builtin> {
    let body = line.trim().strip_prefix("RVM_BUILTIN(")?.strip_suffix(')')?;
    let (suffix, rest) = body.split_once(',')?;
    let (name, rest) = rest.trim().strip_prefix('"')?.split_once('"')?;
    let (properties, doc) = rest.trim().strip_prefix(',')?.split_once(',')?;
    let properties: Vec<&str> = properties.split('|').map(str::trim).collect();
    for p in &properties {
        assert!(
            ["RVM_PLAIN", "RVM_READ_ONLY", "RVM_INLINED"].contains(p),
            "rvm_builtins.def: {name} has an unknown property {p}"
        );
    }
    Some(Builtin {
        name,
        symbol: format!("rvm_builtin_{}", suffix.trim()),
        doc: doc.trim().trim_matches('"'),
        optional,
        library,
        read_only: properties.contains(&"RVM_READ_ONLY"),
        inlined: properties.contains(&"RVM_INLINED"),
    })
}

/// One call from generated code into the shim.
#[derive(Debug, Clone)]
pub struct ShimCall {
    pub name: String,
    pub params: Vec<Type>,
    pub ret: Option<Type>,
}

fn c_type(t: &str) -> Option<Type> {
    let t = t.trim();
    if t.ends_with('*') {
        return Some(types::I64);
    }
    match t.split_whitespace().last().unwrap_or("") {
        "int" | "int32_t" => Some(types::I32),
        "int64_t" => Some(types::I64),
        _ => None,
    }
}

/// The shim calls, by name.
pub fn shim_calls() -> &'static HashMap<String, ShimCall> {
    static TABLE: OnceLock<HashMap<String, ShimCall>> = OnceLock::new();
    TABLE.get_or_init(|| CALLS.lines().filter_map(parse_call).map(|c| (c.name.clone(), c)).collect())
}

/// `RVM_CALL(ret, name, (type name, ...), "doc")`
fn parse_call(line: &str) -> Option<ShimCall> {
    let body = line.trim().strip_prefix("RVM_CALL(")?;
    let (ret, rest) = body.split_once(',')?;
    let (name, rest) = rest.split_once(',')?;
    let params = rest.trim().strip_prefix('(')?.split_once(')')?.0;
    // Each parameter is "<type> <name>"; dropping the name leaves the type.
    let params = params
        .split(',')
        .map(|p| {
            let ty = if p.contains('*') { "void *" } else { p.trim().rsplit_once(' ').map_or(p, |(t, _)| t) };
            c_type(ty).unwrap_or_else(|| panic!("rvm_calls.def: {name} has a parameter of unknown type {p}"))
        })
        .collect();
    let ret = if ret.trim() == "void" { None } else { Some(c_type(ret).expect("rvm_calls.def: return type")) };
    Some(ShimCall { name: name.trim().to_string(), params, ret })
}

/// Declares shim function `name` (a line of `rvm_calls.def`) as an import of `module`.
pub fn declare_call<M: Module>(module: &mut M, name: &str) -> Result<FuncId, CodegenError> {
    let call = shim_calls().get(name).unwrap_or_else(|| panic!("{name} missing from rvm_calls.def"));
    let mut sig = module.make_signature();
    sig.params.extend(call.params.iter().map(|t| AbiParam::new(*t)));
    sig.returns.extend(call.ret.map(AbiParam::new));
    Ok(module.declare_function(&call.name, Linkage::Import, &sig)?)
}

/// The TVM-FFI safe-call signature of kernels, builtins and tvm-ffi entry points:
/// `(self, args, num_args, result) -> status`.
pub fn packed_signature<M: Module>(module: &M) -> Signature {
    let mut sig = module.make_signature();
    sig.params.extend([types::I64, types::I64, types::I32, types::I64].map(AbiParam::new));
    sig.returns.push(AbiParam::new(types::I32));
    sig
}

/// The signature of a compiled Relax function (`rvm_compiled_fn` in internal.h):
/// `(vm, regs, result, consts, funcs) -> status`.
pub fn compiled_signature<M: Module>(module: &M) -> Signature {
    let mut sig = module.make_signature();
    sig.params.extend([types::I64; 5].map(AbiParam::new));
    sig.returns.push(AbiParam::new(types::I32));
    sig
}

#[cfg(test)]
mod tests {
    #[test]
    fn builtin_table_parses_and_covers_the_required_builtins() {
        for name in [
            "alloc_shape_heap",
            "alloc_storage",
            "alloc_tensor",
            "check_shape_info",
            "check_tensor_info",
            "copy",
            "invoke_closure",
            "make_closure",
            "make_prim_value",
            "make_shape",
            "make_tuple",
            "match_shape",
            "null_value",
            "read_if_cond",
            "reshape",
            "shape_of",
            "tensor_to_shape",
            "tuple_getitem",
        ] {
            let b = super::find_builtin(&format!("vm.builtin.{name}")).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(b.symbol, format!("rvm_builtin_{name}"));
        }
        assert!(super::builtins().len() >= 26);
        let kv = super::find_builtin("vm.builtin.kv_state_begin_forward").expect("KV cache function");
        assert!(kv.optional && !super::find_builtin("vm.builtin.copy").expect("copy").optional);
        let inlined: Vec<&str> = super::builtins().iter().filter(|b| b.inlined).map(|b| b.name).collect();
        assert_eq!(inlined, ["vm.builtin.copy", "vm.builtin.null_value"]);
        let read_only: Vec<&str> = super::builtins().iter().filter(|b| b.read_only).map(|b| b.name).collect();
        assert_eq!(read_only, ["vm.builtin.check_tensor_info", "vm.builtin.match_shape"]);
        assert!(super::find_builtin("vm.builtin.check_tensor_info").expect("check").doc.starts_with("(v, i<ndim>"));
    }

    #[test]
    fn shim_call_table_parses() {
        let calls = super::shim_calls();
        let invoke = &calls["rvm_invoke"];
        assert_eq!(invoke.params.len(), 5);
        assert_eq!(invoke.params[3], cranelift_codegen::ir::types::I32);
        assert!(calls["rvm_object_decref"].ret.is_none());
    }
}
