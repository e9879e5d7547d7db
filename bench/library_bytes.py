#!/usr/bin/env python3
"""Bytes the kernel library adds to a model: the sizes of the symbols (code and read-only data)
that the model's .so holds from relaxc's kernel archive (librvm_kernels.a), read with nm.

usage: python3 bench/library_bytes.py MODEL.so [MODEL.so...]   (cargo build --release first)
"""

import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def archive_symbols():
    archives = sorted(
        glob.glob(os.path.join(ROOT, "target/release/build/relaxc-*/out/librvm_kernels.a")), key=os.path.getmtime
    )
    if not archives:
        sys.exit("no librvm_kernels.a under target/release: run cargo build --release first")
    out = subprocess.run(["nm", "--defined-only", archives[-1]], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    names = archive_symbols()
    print("| model | kernel library bytes (code + constants) | .so bytes |")
    print("|---|---|---|")
    for so in sys.argv[1:]:
        out = subprocess.run(["nm", "-S", "--defined-only", so], capture_output=True, text=True, check=True).stdout
        total = 0
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[2].lower() in "tr" and parts[3] in names:
                total += int(parts[1], 16)
        print(f"| {os.path.basename(so)} | {total:,} | {os.path.getsize(so):,} |")


if __name__ == "__main__":
    main()
