"""python -m relaxc.llm build MODEL.gguf -o MODEL.so: the command line of relaxc.llm.build."""

import argparse
import sys

from .. import book_page, exit_without_extra


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m relaxc.llm",
        description="LLMs from GGUF files as relaxc models.",
        epilog=f"The manual's page: {book_page('gguf')}.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser(
        "build",
        help="build the model of a GGUF file (llama, mistral, qwen2, qwen3, phi3) into a .so",
        description="Build the model of a GGUF file into a .so whose weights stay in the file: run it with "
        "`relaxc generate MODEL.so --weights MODEL.gguf`. Dense layers run on relaxc's quantized kernels in the "
        "file's own formats (f32, f16, q8_0, q4_0, q4_K, q6_K).",
    )
    b.add_argument("gguf", help="the GGUF file")
    b.add_argument("-o", "--output", required=True, help="the .so to write")
    b.add_argument(
        "--exec-mode",
        choices=["bytecode", "compiled"],
        default="bytecode",
        help="as relaxc compile's",
    )
    b.add_argument("--target", help="a target triple for a board (as relaxc compile's --target)")
    args = parser.parse_args(argv)
    exit_without_extra("llm", "python -m relaxc.llm build", ["tvm", "gguf"])
    from . import GGUFError, build

    try:
        build(args.gguf, args.output, exec_mode=args.exec_mode, target=args.target)
    except (GGUFError, RuntimeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
