//! Fuzzes the `.npz` reader behind `relaxc run --inputs` on arbitrary bytes: it must return an
//! error or arguments whose tensors hold exactly the bytes their shapes need, never panic, abort
//! on an allocation or read more than an array's declared size.
//! Run: `fuzz/run.sh npz` (seed corpus: the fixtures' .npz files).
#![no_main]

use libfuzzer_sys::fuzz_target;
use relaxc::host::Input;

fuzz_target!(|data: &[u8]| {
    let Ok(inputs) = relaxc::host::npz::read_inputs_from(std::io::Cursor::new(data), "fuzz") else { return };
    for input in inputs {
        if let Input::Tensor(t) = input {
            let elems: u128 = t.shape.iter().map(|&d| u128::try_from(d).expect("dims are not negative")).product();
            assert_eq!(elems * u128::from(t.dtype.bits / 8), t.data.as_slice().len() as u128);
        }
    }
});
