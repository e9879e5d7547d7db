//! The TVMScript subset relaxc reads: an `@I.ir_module` class of `@R.function`s whose operators
//! are extern kernels. `parser` reads the Python syntax; `convert` gives it TVMScript's meaning
//! and builds Relax IR (`crate::ir`). Every error carries the source span it is about.

pub mod convert;
pub mod lexer;
pub mod parser;
