"""python -m relaxc.onnx MODEL.onnx -o MODEL.so: the command line of relaxc.onnx.build."""

import argparse
import sys

from .. import book_page, exit_without_extra
from . import OnnxError, build, parse_shape


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m relaxc.onnx",
        description="Build an ONNX file as it ships into a relaxc model (.so): shape arithmetic folded at the given "
        "shapes, imported with TVM's ONNX front end, the operators relaxc's kernel library covers run on it, "
        "compiled with relaxc. Prints what runs where.",
        epilog=f"The manual's page: {book_page('onnx')}.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("-o", "--output", required=True, help="the .so to write")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="fix an input's shape (repeat for several inputs); a dimension the file leaves symbolic and no --shape "
        "fixes stays symbolic; a dimension the file fixes is replaced, with a warning (a placeholder an exporter "
        "left), and a graph that cannot take the new shape is an error naming the node",
    )
    parser.add_argument("--exec-mode", choices=["bytecode", "compiled"], default="bytecode", help="as relaxc compile's")
    parser.add_argument("--target", help="a target triple for a board (as relaxc compile's --target)")
    parser.add_argument(
        "--instrument",
        action="store_true",
        help="build for `relaxc run --profile` (time per kernel), as relaxc compile's",
    )
    args = parser.parse_args(argv)
    exit_without_extra("onnx", "python -m relaxc.onnx", ["tvm", "onnx", "onnxsim"])
    try:
        shapes = dict(parse_shape(s) for s in args.shape)
        build(
            args.model,
            args.output,
            shapes=shapes,
            exec_mode=args.exec_mode,
            target=args.target,
            instrument=args.instrument,
        )
    except (OnnxError, RuntimeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
