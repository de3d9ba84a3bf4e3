#!/usr/bin/env python3
"""Crafts hostile checkpoint manifests for test/cli/cli_hostile.sh: changes one field of
DIR/manifest.bin and re-signs it (recomputes the trailing crc32), so that the reader's checks
behind the checksum are what is tested, as an attacker who read core/io/checkpoint.c would do.

  craft_ckpt.py DIR header FIELD VALUE      FIELD: n_files, config_bytes, n_pieces, n_state
  craft_ckpt.py DIR state FIELD VALUE       FIELD: a train-state field (step, optimizer_step, ...)
  craft_ckpt.py DIR piece I FIELD VALUE     FIELD: kind, file, rows, cols, row0, row1, col0, col1,
                                            lo, hi, offset; or offset=piece:J (piece J's offset)
  craft_ckpt.py DIR get-state FIELD         prints a state field
  craft_ckpt.py DIR truncate N              keeps the first N bytes (no re-signing)

VALUE is an integer (any base Python's int() reads, e.g. 0x7fffffff, -1, 2**61 written out) and is
stored in the field's width, two's complement. The layout (core/io/checkpoint.c): a 64-byte header
(magic, version, byte-order mark, n_files u32 at 16, config_bytes u32 at 20, n_pieces i64 at 24,
n_state u32 at 32), n_state i64 state fields, n_pieces 152-byte piece records (name 64, kind i32
at 64, file i32 at 68, rows .. hi i64 at 72..128, offset i64 at 136, crc u32 at 144), the config
text, then crc32 of everything before it.
"""
import struct
import sys
import zlib

STATE = ["step", "samples_seen", "tokens_seen", "optimizer_step", "seed", "global_batch", "arch",
         "vocab_size", "vocab_pad", "seq_len", "n_layer", "d_model", "n_head", "n_kv_head", "d_ff",
         "world_size", "tp", "pp", "dp", "zero_stage", "virtual_stages", "precision",
         "format_version", "tokenizer_crc"]
HEADER = {"n_files": (16, "<I"), "config_bytes": (20, "<I"), "n_pieces": (24, "<q"),
          "n_state": (32, "<I")}
PIECE = {"kind": (64, "<i"), "file": (68, "<i"), "offset": (136, "<q")}
for i, f in enumerate(["rows", "cols", "row0", "row1", "col0", "col1", "lo", "hi"]):
    PIECE[f] = (72 + 8 * i, "<q")
RECORD, HEADER_BYTES = 152, 64


def put(buf, off, fmt, value):
    bits = 8 * struct.calcsize(fmt)
    value &= (1 << bits) - 1  # two's complement in the field's width
    if fmt[1].islower():
        value = value - (1 << bits) if value >= 1 << (bits - 1) else value
    struct.pack_into(fmt, buf, off, value)


def main(argv):
    d, what = argv[1], argv[2]
    path = d + "/manifest.bin"
    buf = bytearray(open(path, "rb").read())
    n_state = struct.unpack_from("<I", buf, 32)[0]
    pieces_at = HEADER_BYTES + 8 * n_state
    if what == "truncate":
        open(path, "wb").write(buf[: int(argv[3], 0)])
        return
    if what == "get-state":
        print(struct.unpack_from("<q", buf, HEADER_BYTES + 8 * STATE.index(argv[3]))[0])
        return
    if what == "header":
        off, fmt = HEADER[argv[3]]
        put(buf, off, fmt, int(argv[4], 0))
    elif what == "state":
        put(buf, HEADER_BYTES + 8 * STATE.index(argv[3]), "<q", int(argv[4], 0))
    elif what == "piece":
        at = pieces_at + RECORD * int(argv[3])
        off, fmt = PIECE[argv[4]]
        if argv[5].startswith("piece:"):
            src = pieces_at + RECORD * int(argv[5][6:])
            value = struct.unpack_from(fmt, buf, src + off)[0]
        else:
            value = int(argv[5], 0)
        put(buf, at + off, fmt, value)
    else:
        sys.exit("craft_ckpt.py: unknown command " + what)
    struct.pack_into("<I", buf, len(buf) - 4, zlib.crc32(bytes(buf[:-4])) & 0xFFFFFFFF)
    open(path, "wb").write(buf)


if __name__ == "__main__":
    main(sys.argv)
