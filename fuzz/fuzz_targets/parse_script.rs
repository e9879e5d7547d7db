//! Fuzzes the front end on arbitrary text: lexer, parser, conversion to IR, lowering and the
//! verifier must return an error or a valid executable, never panic or hang.
//! Run: `fuzz/run.sh parse_script` (seed corpus: fixtures/script/*/m.py).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let Ok(stmts) = relaxc::script::parser::parse(src) else { return };
    let Ok(module) = relaxc::script::convert::convert(&stmts, &Default::default()) else { return };
    if let Ok(lowered) = relaxc::lower::lower(&module) {
        relaxc::vm::verify(&lowered.exec).expect("lowering must produce a valid executable");
    }
});
