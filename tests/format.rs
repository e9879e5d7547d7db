//! The VMExecutable reader and writer against TVM's own bytes: every fixture's executable,
//! read and written back, is byte-identical to what TVM exported; and the encoding of
//! arguments and instructions round-trips.

mod common;

use relaxc::tvm;
use relaxc::vm::format;
use relaxc::vm::{Arg, Executable, Instr, VM_REG, VOID_REG};

#[test]
fn writer_reproduces_tvm_bytes_for_every_fixture() {
    let fixtures = common::fixtures();
    assert!(fixtures.len() >= 10, "fixtures missing");
    for f in fixtures {
        let export = tvm::import_tar(&f.tar()).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let written = format::write_executable(&export.exec);
        assert!(written[..] == *export.exec_bytes, "{}: written executable differs from TVM's bytes", f.name);
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
        Constant::Str("quote \" back\\slash\nnewline µ\u{1}".into()),
        Constant::Float(f64::NAN),
        Constant::DataType(DType::new(2, 32, 4)),
        Constant::DataType(DType::new(6, 8, 1)),
        Constant::Shape(vec![]),
        Constant::Shape(vec![7, 8]),
        Constant::DataType(DType::new(2, 16, 1)),
        Constant::Tensor(TensorConst {
            dtype: DType::new(0, 16, 1),
            shape: vec![2, 2],
            data: vec![1, 0, 2, 0, 3, 0, 4, 0].into(),
        }),
        Constant::Tensor(TensorConst { dtype: DType::F32, shape: vec![], data: 1.5f32.to_le_bytes().to_vec().into() }),
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
    let back: Executable = format::read_executable(&format::write_executable(&exec)).expect("reads back");
    assert_eq!(format::write_executable(&back), format::write_executable(&exec));
    let text = relaxc::vm::asm::disassemble(&exec);
    let assembled = relaxc::vm::asm::assemble(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(format::write_executable(&assembled), format::write_executable(&exec), "{text}");
    assert!(
        exec.stats().contains("NaN, float32x4, bool, shapetupl], shapetuple[7, 8], float16, [2, 2], scalar]"),
        "{}",
        exec.stats()
    );
}

/// The text form must lose nothing: assembling a disassembly gives the same executable bytes,
/// for TVM's fixtures, the script front end's output and a batch of random programs.
#[test]
fn text_form_round_trips_to_identical_bytes() {
    use relaxc::vm::asm::{assemble, disassemble};
    let check = |name: &str, exec: &Executable| {
        let text = disassemble(exec);
        let back = assemble(&text).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert!(
            format::write_executable(&back) == format::write_executable(exec),
            "{name}: the text form does not reassemble to the same bytes\n{text}"
        );
        assert_eq!(disassemble(&back), text, "{name}: second disassembly differs");
    };
    for f in common::fixtures() {
        check(&f.name, &tvm::import_tar(&f.tar()).unwrap_or_else(|e| panic!("{}: {e}", f.name)).exec);
    }
    let mut scripts = 0;
    for fixture in common::script_fixtures() {
        let program = fixture.source();
        let inputs = fixture.options(relaxc::codegen::ExecMode::Bytecode).script;
        let loaded = relaxc::compile::load_script(&program, &inputs).unwrap_or_else(|e| panic!("{e:#}"));
        check(&program.display().to_string(), &loaded.exec);
        scripts += 1;
    }
    assert!(scripts >= 5, "script fixtures missing");
    check("random batch", &common::random::generate(7, 200).exec);
}

#[test]
fn text_form_errors_name_the_line() {
    use relaxc::vm::asm::assemble;
    let err = assemble("relaxc-asm 1\nfunc main bytecode at=0 regs=1 params=-\n  call nowhere in: %0 dst: %void\n")
        .expect_err("unknown function");
    assert_eq!(err.line, 3);
    assert!(err.message.contains("nowhere"), "{err}");
    assert_eq!(assemble("not asm").expect_err("header").line, 1);
    let err = assemble("relaxc-asm 1\nconst 1 int 3\n").expect_err("constant order");
    assert_eq!(err.line, 2);
}

/// A bounded stand-in for the `assemble` fuzz target: mutated listings must assemble or be
/// rejected with a line number, and what assembles must verify or be rejected, never panic.
#[test]
fn mutated_text_never_panics() {
    use relaxc::vm::asm::{assemble, disassemble};
    let sources: Vec<String> = common::fixtures()
        .iter()
        .map(|f| disassemble(&tvm::import_tar(&f.tar()).expect("fixture").exec))
        .chain([disassemble(&common::random::generate(11, 20).exec)])
        .collect();
    let snippets =
        ["%", "%void", "i-", "c[", "f[", "]", ", ", " in: ", " dst: ", "\n  ", "=", "9999999999999999999", "\n"];
    let count: usize = common::random::fuzz_count(3000);
    let mut rng = common::random::Rng::new(0xa55e_b1e0_0000_0001);
    let (mut verified, mut invalid, mut rejected) = (0, 0, 0);
    for _ in 0..count {
        let source = &sources[rng.below(sources.len())];
        let text = common::random::mutate_text(&mut rng, source, &snippets, b"0123456789%-,=[] \nic");
        match assemble(&text) {
            Ok(exec) => match relaxc::vm::verify(&exec) {
                Ok(()) => verified += 1,
                Err(_) => invalid += 1,
            },
            Err(e) => {
                assert!(e.line >= 1 && e.line <= text.lines().count().max(1), "line {} out of range: {e}", e.line);
                rejected += 1;
            }
        }
    }
    eprintln!("{count} mutated listings: {verified} verified, {invalid} assembled but invalid, {rejected} rejected");
    assert!(rejected > 0 && verified > 0, "mutations too weak or too strong to exercise the assembler");
}

/// A program written directly in the text form (fixtures/asm/loop.rvmasm: a loop of If and
/// goto) compiles, and runs to the same results and the same errors in both modes.
#[test]
fn hand_written_text_runs_in_both_modes() {
    use relaxc::abi::DLDataType;
    use relaxc::codegen::ExecMode;
    use relaxc::host::{HostTensor, Input, Model, Output};
    let source = common::root().join("fixtures/asm/loop.rvmasm");
    let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let f32 = DLDataType { code: 2, bits: 32, lanes: 1 };
    let mut errors = Vec::new();
    for mode in [ExecMode::Bytecode, ExecMode::Compiled] {
        let mut options = relaxc::compile::Options::mode(mode);
        options.script.kernels = vec![common::root().join("tests/kernels/random_kernels.c")];
        let so = common::build_with("asm_loop", &source, &options, common::mode_name(mode)).expect("build");
        let model = Model::load(&so).expect("load");
        let main = model.find("main").expect("main");
        let mut vm = model.vm().expect("vm");
        for (k, want) in [(0, [2.0f32, 4.0, 6.0, 8.0]), (2, [18.0, 36.0, 54.0, 72.0])] {
            let inputs = [Input::Tensor(HostTensor::new(f32, vec![4], &x)), Input::Int(k)];
            let out = vm.call(main, &inputs).expect("call").to_output().flatten();
            let want: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
            match out.as_slice() {
                [Output::Tensor { data, shape, .. }] => {
                    assert_eq!((shape.as_slice(), data), ([4i64].as_slice(), &want), "{mode:?}, k={k}")
                }
                other => panic!("{mode:?}: unexpected results {other:?}"),
            }
        }
        let wrong =
            [Input::Tensor(HostTensor::new(f32, vec![4], &x)), Input::Tensor(HostTensor::new(f32, vec![4], &x))];
        errors.push(vm.call(main, &wrong).map(|_| ()).expect_err("k must be an int").to_string());
    }
    assert!(errors[0].contains("in main at pc 4 (rk_gt0)"), "{}", errors[0]);
    assert_eq!(errors[0], errors[1], "the modes report the error differently");
}

/// Found by the `assemble` fuzz target: a tensor constant whose data did not match its shape
/// passed the verifier, so an executable it accepted could not be read back (and kernels would
/// have read past the data). The verifier now checks every tensor constant's size.
#[test]
fn tensor_constants_must_hold_what_their_shape_needs() {
    use relaxc::vm::{Constant, DType, ExecBuilder, Instr, TensorConst};
    for (shape, bytes, ok) in
        [(vec![2, 3], 24, true), (vec![2, 3], 23, false), (vec![-1], 0, false), (vec![1 << 62, 4], 0, false)]
    {
        let mut b = ExecBuilder::new();
        b.constant(Constant::Tensor(TensorConst {
            dtype: DType::F32,
            shape: shape.clone(),
            data: vec![0; bytes].into(),
        }));
        b.begin_function("main", &["x"]);
        b.emit(Instr::Ret { result: 0 });
        b.end_function(1);
        let result = relaxc::vm::verify(&b.build());
        assert_eq!(result.is_ok(), ok, "{shape:?} with {bytes} bytes: {result:?}");
        if let Err(e) = result {
            assert!(e.to_string().contains("constant 0: a tensor of shape"), "{e}");
        }
    }
}
