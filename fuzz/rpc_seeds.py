"""Seeds for the rpc_packet fuzz target: packet streams a client sends after the handshake
(tvm-rpc.md), one file each, with the handles relaxc's server gives out in a fresh session
(serial << 32 | (slot + 1) << 4; data tokens add 8).

usage: python3 fuzz/rpc_seeds.py DIR
"""

import os
import struct
import sys


def packet(code, payload=b""):
    body = struct.pack("<i", code) + payload
    return struct.pack("<Q", len(body)) + body


def seq(*values):
    return struct.pack("<i", len(values)) + b"".join(values)


def none():
    return struct.pack("<i", 0)


def int_(v, tag=1):
    return struct.pack("<iq", tag, v)


def ptr(h):
    return struct.pack("<iQ", 4, h)


def raw_str(s):
    return struct.pack("<iQ", 8, len(s)) + s


def bytes_(b):
    return struct.pack("<iIQ", 66 if len(b) > 7 else 12, 66, len(b)) + b


def dltensor(data, shape, dtype=(2, 32, 1), offset=0):
    return (
        struct.pack("<Qiii", data, 1, 0, len(shape))
        + struct.pack("<BBH", *dtype)
        + b"".join(struct.pack("<q", d) for d in shape)
        + struct.pack("<Q", offset)
    )


def handle(serial, slot):
    return serial << 32 | (slot + 1) << 4


INIT = packet(2, struct.pack("<Q", 5) + b"0.8.0" + seq())


def call(h, *args):
    return packet(3, struct.pack("<Q", h) + seq(*args))


def workflow():
    max_packet, buffer, array_size, timer, upload, load = (
        handle(1, 0),
        handle(2, 1),
        handle(3, 2),
        handle(4, 3),
        handle(5, 4),
        handle(6, 5),
    )
    token = buffer | 8
    return b"".join(
        [
            INIT,
            packet(9, seq(raw_str(b"tvm.rpc.server.GetCRTMaxPacketSize"))),
            call(max_packet),
            packet(17, seq(struct.pack("<i", 7) + dltensor(0, [2, 4]), none())),
            packet(7, dltensor(token, [2, 4]) + struct.pack("<Q", 32) + bytes(range(32))),
            packet(6, dltensor(token, [2, 4], offset=16) + struct.pack("<Q", 16)),
            packet(15, seq(struct.pack("<iii", 6, 1, 0), ptr(0))),
            packet(9, seq(raw_str(b"ffi.ArraySize"))),
            call(array_size, struct.pack("<iIQ", 115, 115, token)),
            packet(9, seq(raw_str(b"runtime.RPCTimeEvaluator"))),
            call(timer, none(), raw_str(b"main"), *[int_(v) for v in (1, 0, 3, 2, 0, 100, 0, 1, 0)], raw_str(b"")),
            packet(9, seq(raw_str(b"tvm.rpc.server.upload"))),
            call(upload, raw_str(b"x.bin"), bytes_(b"")),
            call(upload, raw_str(b"../x"), bytes_(b"abc")),
            packet(9, seq(raw_str(b"tvm.rpc.server.load_module"))),
            call(load, raw_str(b"x.bin")),
            packet(14, seq(struct.pack("<iii", 6, 1, 0), ptr(token))),
            packet(10, seq(ptr(max_packet))),
            packet(9, seq(raw_str(b"no.such.function"))),
            packet(1),
        ]
    )


def odd_requests():
    return b"".join(
        [
            packet(9, seq(raw_str(b"tvm.rpc.server.upload"))),  # before kInitServer
            packet(2, struct.pack("<Q", 5) + b"0.7.0" + seq()),
            INIT,
            packet(13, seq(struct.pack("<iii", 6, 1, 0), int_(64), int_(64), struct.pack("<iBBHi", 5, 2, 32, 1, 0))),
            packet(17, seq(struct.pack("<i", 7) + dltensor(0, [3]), raw_str(b"global"))),
            packet(
                16,
                seq(
                    struct.pack("<i", 7) + dltensor(handle(1, 0) | 8, [2]),
                    struct.pack("<i", 7) + dltensor(handle(2, 1) | 8, [2]),
                    ptr(0),
                ),
            ),
            packet(12, seq(struct.pack("<iii", 6, 1, 0), int_(0))),
            packet(11, seq(struct.pack("<iii", 6, 1, 0))),
            packet(3, struct.pack("<Q", 0xDEADBEEF) + seq(int_(1), int_(1, 2), struct.pack("<id", 3, 1.5))),
            packet(21),
        ]
    )


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in [("workflow", workflow()), ("odd_requests", odd_requests()), ("init", INIT)]:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


main()
