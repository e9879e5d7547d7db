//! The VMExecutable reader and writer against TVM's own bytes: every fixture's executable,
//! read and written back, is byte-identical to what TVM exported; and the encoding of
//! arguments and instructions round-trips.

mod common;

use relaxc::tvm::{self, executable};
use relaxc::vm::{Arg, Executable, Instr, VM_REG, VOID_REG};

#[test]
fn writer_reproduces_tvm_bytes_for_every_fixture() {
    let fixtures = common::fixtures();
    assert!(fixtures.len() >= 10, "fixtures missing");
    for f in fixtures {
        let export = tvm::import_tar(&f.tar()).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let written = executable::write_executable(&export.exec);
        assert!(written == export.exec_bytes, "{}: written executable differs from TVM's bytes", f.name);
    }
}

#[test]
fn argument_words_match_the_spec_examples() {
    assert_eq!(Arg::Imm(2).encode() as u64, 0x0100000000000002);
    assert_eq!(Arg::Const(1).encode() as u64, 0x0200000000000001);
    assert_eq!(Arg::Imm(-7).encode() as u64, 0x01FFFFFFFFFFFFF9);
    assert_eq!(Arg::Reg(VOID_REG).encode() as u64, 0x0040000000000000);
    for a in [
        Arg::Imm(-7),
        Arg::Imm((1 << 55) - 1),
        Arg::Imm(-((1 << 55) - 1)),
        Arg::Reg(VM_REG),
        Arg::Func(12),
        Arg::Const(0),
    ] {
        assert_eq!(Arg::decode(a.encode()), Some(a));
    }
    assert_eq!(Arg::decode(0x0400000000000000), None, "kind 4 does not exist");
}

#[test]
fn instructions_round_trip() {
    let instrs = [
        Instr::Call {
            dst: 3,
            func: 2,
            args: vec![Arg::Reg(0), Arg::Imm(-1), Arg::Const(4), Arg::Func(1), Arg::Reg(VM_REG)],
        },
        Instr::Call { dst: VOID_REG, func: 0, args: vec![] },
        Instr::Ret { result: 5 },
        Instr::Goto { offset: -3 },
        Instr::If { cond: 2, false_offset: 7 },
    ];
    let mut words = Vec::new();
    for i in &instrs {
        i.encode(&mut words);
    }
    let mut at = 0;
    for i in &instrs {
        let (decoded, len) = Instr::decode(&words[at..]).expect("decodes");
        assert_eq!(&decoded, i);
        at += len;
    }
    assert_eq!(at, words.len());
}

#[test]
fn float_and_every_constant_kind_round_trip() {
    use relaxc::vm::{Constant, DType, ExecBuilder, TensorConst};
    let mut b = ExecBuilder::new();
    let consts = [
        Constant::Float(2.5),
        Constant::Int(1 << 60),
        Constant::Str("hello".into()),
        Constant::Shape(vec![]),
        Constant::Shape(vec![7, 8]),
        Constant::DataType(DType::new(2, 16, 1)),
        Constant::Tensor(TensorConst {
            dtype: DType::new(0, 16, 1),
            shape: vec![2, 2],
            data: vec![1, 0, 2, 0, 3, 0, 4, 0],
        }),
        Constant::Tensor(TensorConst { dtype: DType::F32, shape: vec![], data: 1.5f32.to_le_bytes().to_vec() }),
    ];
    for c in &consts {
        b.constant(c.clone());
    }
    b.constant(Constant::Float(2.5)); // deduplicated
    b.begin_function("main", &["x"]);
    b.emit(Instr::Ret { result: 0 });
    b.end_function(1);
    let exec = b.build();
    assert_eq!(exec.constants.len(), consts.len());
    let back: Executable = executable::read_executable(&executable::write_executable(&exec)).expect("reads back");
    assert_eq!(back, exec);
    assert!(
        exec.stats()
            .contains("[2.5, 1152921504606846976, \"hello\", shapetupl], shapetuple[7, 8], float16, [2, 2], scalar]"),
        "{}",
        exec.stats()
    );
}
