//! The layouts of prepacked weights that the kernel library reads
//! (`runtime-kernels/src/rk.h`): the script front end packs constant weights at compile time,
//! as relaxc.tvm does in Python (`python/relaxc/_pack.py`).

/// Rows of A a micro-kernel strip holds (`RK_MR`): a prepacked A is `[ceil(m / 6)][k][6]`.
pub const KERNEL_STRIP_ROWS: usize = 6;
/// Columns of B a micro-kernel panel holds (`RK_NR`): a prepacked B is `[ceil(n / 16)][k][16]`.
pub const KERNEL_PANEL_COLUMNS: usize = 16;

pub(super) fn constants() -> Vec<(&'static str, u64)> {
    vec![("RK_MR", KERNEL_STRIP_ROWS as u64), ("RK_NR", KERNEL_PANEL_COLUMNS as u64)]
}
