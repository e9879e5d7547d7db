//! The builtins and runtime functions the runtime shim provides, read from the shim's own tables
//! (`runtime-shim/include/rvm_builtins.def`, the core, and `rvm_runtime.def`, the optional
//! functions linked only into models that use them) so that the compiler and the shim cannot
//! disagree.

use std::sync::OnceLock;

const CORE: &str = include_str!("../../runtime-shim/include/rvm_builtins.def");
const OPTIONAL: &str = include_str!("../../runtime-shim/include/rvm_runtime.def");

#[derive(Clone, Debug)]
pub struct Builtin {
    /// Name bytecode uses, e.g. `vm.builtin.alloc_storage`.
    pub name: &'static str,
    /// C symbol in the shim, e.g. `rvm_builtin_alloc_storage`.
    pub symbol: String,
    pub doc: &'static str,
    /// In the optional archive: linked only into models that refer to it.
    pub optional: bool,
}

/// Every builtin, in table order.
pub fn all() -> &'static [Builtin] {
    static TABLE_PARSED: OnceLock<Vec<Builtin>> = OnceLock::new();
    TABLE_PARSED.get_or_init(|| {
        let core = CORE.lines().filter_map(|l| parse_line(l, false));
        core.chain(OPTIONAL.lines().filter_map(|l| parse_line(l, true))).collect()
    })
}

/// The builtin with this bytecode name.
pub fn find(name: &str) -> Option<&'static Builtin> {
    all().iter().find(|b| b.name == name)
}

/// `RVM_BUILTIN(suffix, "name", "doc")`
fn parse_line(line: &'static str, optional: bool) -> Option<Builtin> {
    let body = line.trim().strip_prefix("RVM_BUILTIN(")?.strip_suffix(')')?;
    let (suffix, rest) = body.split_once(',')?;
    let mut quoted = rest.split('"').skip(1).step_by(2);
    let name = quoted.next()?;
    let doc = quoted.next().unwrap_or("");
    Some(Builtin { name, symbol: format!("rvm_builtin_{}", suffix.trim()), doc, optional })
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_parses_and_covers_the_required_builtins() {
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
            let b = super::find(&format!("vm.builtin.{name}")).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(b.symbol, format!("rvm_builtin_{name}"));
        }
        assert!(super::all().len() >= 26);
        let kv = super::find("vm.builtin.kv_state_begin_forward").expect("KV cache function");
        assert!(kv.optional && !super::find("vm.builtin.copy").expect("copy").optional);
    }
}
