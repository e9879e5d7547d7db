//! Fuzzes the `.safetensors` weights loader behind `relaxc compile --params` on arbitrary bytes:
//! an error, or tensors whose data is exactly what their shapes and dtypes need.
//! Run: `fuzz/run.sh safetensors` (seed corpus: fixtures/script/mlp/w.safetensors).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tensors) = relaxc::weights::safetensors_from_bytes(data) else { return };
    for t in tensors.values() {
        let elems: u128 = t.shape.iter().map(|&d| u128::try_from(d).expect("dims are not negative")).product();
        assert_eq!(elems * u128::from(t.dtype.bits) / 8, t.data.len() as u128);
    }
});
