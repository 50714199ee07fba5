#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Write the seed corpora in fuzz/corpus/<target>/seed-* (valid inputs the
fuzzer mutates).  Run again after a message or struct layout changes;
crash reproducers (crash-*) in the same folders are kept as they are."""
import os
import struct

top = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(top, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- fuzz_boot_msg: tcp.c messages (all big-endian) ----
MAGIC, VER = 0x46455042, 1
HELLO, WELCOME, REJECT, GATHER, RESULT, ERROR = range(1, 7)


def hdr(typ, rank, size, seq, length):
    return struct.pack(">IHHiiQQ", MAGIC, VER, typ, rank, size, seq, length)


def err(typ, rank, size, seq, code, culprit, text):
    body = struct.pack(">ii", code, culprit) + text.encode().ljust(256, b"\0")
    return hdr(typ, rank, size, seq, len(body)) + body


for sb in range(4):
    size = 2 + sb
    for L in (0, 1, 8):
        # a rank's view: welcome, then results
        s = hdr(WELCOME, 0, size, 0, 0)
        for c in range(3):
            s += hdr(RESULT, 0, size, c, size * L) + bytes(range(size * L))
        put("fuzz_boot_msg", "rank-%d-%d" % (size, L),
            bytes([0, sb, 0, L]) + s)
        # the root's view: every rank's hello and gathers
        data = bytes([1, sb, 0, L])
        for r in range(1, size):
            s = hdr(HELLO, r, size, 0, 0)
            for c in range(3):
                s += hdr(GATHER, r, size, c, L) + bytes([r] * L)
            data += struct.pack(">H", len(s)) + s
        put("fuzz_boot_msg", "root-%d-%d" % (size, L), data)
put("fuzz_boot_msg", "rank-reject",
    bytes([0, 0, 0, 4]) + err(REJECT, 0, 2, 0, -22, -1, "rank 1 is not in 1..0"))
put("fuzz_boot_msg", "rank-error",
    bytes([0, 1, 1, 4]) + hdr(WELCOME, 0, 3, 0, 0)
    + err(ERROR, 0, 3, 0, -110, 2, "allgather failed at rank 2"))
s = hdr(HELLO, 1, 2, 0, 0) + err(ERROR, 1, 2, 0, -12, 1, "out of memory")
put("fuzz_boot_msg", "root-error", bytes([1, 0, 0, 4]) + struct.pack(">H", len(s)) + s)

# ---- fuzz_env: lines of <variable index><value> ----
V = ["FABEP_RANK", "FABEP_WORLD_SIZE", "FABEP_LOCAL_RANK", "FABEP_LOCAL_SIZE",
     "FABEP_ROOT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
     "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
     "FABEP_PROVIDER", "FABEP_DOMAIN", "FABEP_SIGNAL", "FABEP_TIMEOUT_MS",
     "FABEP_HEAP_SIZE", "FABEP_THREADS", "FABEP_NUMA_NODE",
     "FABEP_AR_ONESTAGE_MAX", "FABEP_AR_HALVING_MAX",
     "FABEP_RENDEZVOUS_TIMEOUT_MS"]


def env(pairs):
    return b"\n".join(bytes([V.index(k)]) + v.encode() for k, v in pairs)


put("fuzz_env", "fabep", env([("FABEP_RANK", "1"), ("FABEP_WORLD_SIZE", "4"),
                             ("FABEP_ROOT", "127.0.0.1:47592"),
                             ("FABEP_LOCAL_RANK", "1"), ("FABEP_LOCAL_SIZE", "2")]))
put("fuzz_env", "ipv6", env([("FABEP_RANK", "0"), ("FABEP_WORLD_SIZE", "2"),
                            ("FABEP_ROOT", "[::1]:1234")]))
put("fuzz_env", "ompi", env([("OMPI_COMM_WORLD_RANK", "3"),
                            ("OMPI_COMM_WORLD_SIZE", "8"),
                            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                            ("FABEP_ROOT", "node1:5000")]))
put("fuzz_env", "pmi", env([("PMI_RANK", "0"), ("PMI_SIZE", "1"),
                           ("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "1")]))
put("fuzz_env", "slurm", env([("SLURM_PROCID", "2"), ("SLURM_NTASKS", "3"),
                             ("SLURM_LOCALID", "0"), ("FABEP_ROOT", "h:1")]))
put("fuzz_env", "attrs", env([("FABEP_PROVIDER", "tcp"), ("FABEP_DOMAIN", "lo"),
                             ("FABEP_SIGNAL", "fence"),
                             ("FABEP_TIMEOUT_MS", "0x7530"),
                             ("FABEP_HEAP_SIZE", "64MiB"),
                             ("FABEP_THREADS", "4"), ("FABEP_NUMA_NODE", "0"),
                             ("FABEP_AR_ONESTAGE_MAX", "32k")]))
put("fuzz_env", "rendezvous", env([("FABEP_TIMEOUT_MS", "500"),
                                  ("FABEP_RENDEZVOUS_TIMEOUT_MS", "-1")]))

# ---- fuzz_comm_hello: struct fep_hello (host, provider, domain: 64 each;
# int32 signal, int32 status, uint64 heap_size; native order) ----
def hello(host, prov, dom, sig=0, heap=64 << 20):
    return (host.encode().ljust(64, b"\0") + prov.encode().ljust(64, b"\0")
            + dom.encode().ljust(64, b"\0") + struct.pack("<iiQ", sig, 0, heap))


put("fuzz_comm_hello", "same", bytes([1, 0]) + hello("a", "tcp", "lo") * 2)
put("fuzz_comm_hello", "hosts", bytes([3, 2]) + hello("a", "shm", "") * 2
    + hello("b", "shm", "") * 2)
put("fuzz_comm_hello", "differ", bytes([2, 1]) + hello("a", "tcp", "lo")
    + hello("a", "tcp", "lo", 2) + hello("c", "tcp", "lo"))

# ---- fuzz_tool_opts: a flag byte, then NUL-separated arguments ----
def args(flags, *a):
    return bytes([flags]) + b"\0".join(x.encode() for x in a)


put("fuzz_tool_opts", "pingpong", args(0, "-p", "shm", "-S", "all", "-n", "2", "-m"))
put("fuzz_tool_opts", "sizes", args(0, "-S", "64,4k,1M", "-I", "100", "-w", "10"))
put("fuzz_tool_opts", "long", args(0, "--rows", "128", "--cols", "7168",
                                   "--soak", "1.5", "--check", "-f", "fp8"))
put("fuzz_tool_opts", "client", args(2, "-P", "5000", "-T", "2", "host1"))
put("fuzz_tool_opts", "help", args(1, "-h"))
put("fuzz_tool_opts", "bad", args(1, "-x", "--nope", "-I"))
put("fuzz_tool_opts", "timeout", args(0x80, "5000"))

# ---- fuzz_ep_slots ----
# geometry: ranks-1, rank, experts per rank-1, top_k-1, hidden-1,
# max_tokens, type byte (token type | combine fp32 4 | fp8 block 8 | sets 16)
EP_MAGIC, EP_SEQ = 0x66616265704d6f45, 7   # FEP_EP_MAGIC, the harness's call


def ep_hdr(seq=EP_SEQ, status=0, count=0, magic=EP_MAGIC, chunks=0):
    """A whole 64-byte slot header (struct fep_ep_hdr); chunks: the
    record signals a dispatch header announces."""
    return struct.pack("<QiIQI", seq, status, count, magic, chunks) + bytes(36)


def ep(size, rank, epr, k, hidden, T, tt, counts, recs, ccounts, ecounts=None,
       hdrs=None, chdrs=None):
    """hdrs / chdrs: {rank: raw header} replacing a dispatch / combine
    header; ecounts: rows per expert of each header, else counted from the
    records; recs[(r, i)]: (ids, weights[, token index])."""
    d = bytes([size - 1, rank, epr - 1, k - 1, hidden - 1, T, tt])
    for r, c in enumerate(counts):
        raw = (hdrs or {}).get(r)
        if raw is not None:
            d += bytes([1 | (8 if ecounts is None else 0)]) + raw
        elif ecounts is None:
            d += bytes([8, c])       # valid header, count c, rows per
                                     # expert counted from the records
        else:                        # rows per expert given
            d += bytes([0, c])
        if ecounts is not None:
            d += struct.pack("<%dI" % epr, *ecounts[r])
    meta = 8 + 8 * k
    for r in range(size):
        for i in range(T):
            if i < counts[r] and (r, i) in recs:
                v = recs[(r, i)]
                ids, w, tok = v[0], v[1], v[2] if len(v) > 2 else i
                d += struct.pack("<ii", tok, 0) + struct.pack("<%di" % k, *ids) \
                    + struct.pack("<%df" % k, *w)
            else:
                d += bytes(meta)
    for r, c in enumerate(ccounts):
        raw = (chdrs or {}).get(r)
        if raw is not None:
            d += bytes([1, c]) + raw  # combine header given, sent c
        else:
            d += bytes([0, c])       # valid combine header, sent c
    return d


put("fuzz_ep_slots", "bf16", ep(2, 0, 2, 2, 16, 4, 1, [2, 1],
    {(0, 0): ([0, 1], [0.5, 0.5]), (0, 1): ([1, -1], [1.0, 0.0]),
     (1, 0): ([0, 0], [0.25, 0.75])}, [2, 1]))
put("fuzz_ep_slots", "fp8", ep(3, 1, 1, 3, 32, 2, 2 | 8 | 16, [1, 2, 0],
    {(0, 0): ([0, -1, -1], [1, 0, 0]), (1, 0): ([0, 0, -1], [0.5, 0.5, 0]),
     (1, 1): ([-1, -1, 0], [0, 0, 1])}, [1, 0, 2]))
put("fuzz_ep_slots", "bad-ecounts", ep(2, 1, 2, 2, 16, 4, 1, [2, 1],
    {(0, 0): ([2, 3], [0.5, 0.5]), (0, 1): ([3, -1], [1.0, 0.0]),
     (1, 0): ([2, 2], [0.25, 0.75])}, [2, 1], ecounts=[[1, 1], [1, 0]]))
put("fuzz_ep_slots", "fp32", ep(1, 0, 4, 4, 8, 3, 0 | 4, [3],
    {(0, 0): ([0, 1, 2, 3], [.25] * 4), (0, 1): ([3, 2, -1, -1], [.5, .5, 0, 0]),
     (0, 2): ([1, -1, -1, -1], [1, 0, 0, 0])}, [3]))

# one seed per bound on what a peer writes (2 ranks, this rank 1, 2
# experts each, top-2, max_tokens 4): each breaks the one rule its name
# says in rank 0's slot; the harness checks the verdict
# (-FABEP_ERR_PROTOCOL, or the agreed status) against its own reading
B_RECS = {(0, 0): ([2, 3], [0.5, 0.5]), (0, 1): ([3, -1], [1.0, 0.0]),
          (1, 0): ([2, 2], [0.25, 0.75])}
B_EC = [[1, 2], [2, 0]]


def bound(name, counts=(2, 1), recs=None, ecounts=B_EC, hdrs=None, chdrs=None,
          ccounts=(2, 1)):
    r = dict(B_RECS)
    r.update(recs or {})
    put("fuzz_ep_slots", "bound-" + name,
        ep(2, 1, 2, 2, 16, 4, 1, list(counts), r, list(ccounts),
           ecounts=ecounts, hdrs=hdrs, chdrs=chdrs))


bound("valid")
bound("count", hdrs={0: ep_hdr(count=5)}, ecounts=[[1, 2], [2, 0]])
bound("magic", hdrs={0: ep_hdr(count=2, magic=EP_MAGIC ^ 1)})
bound("seq", hdrs={0: ep_hdr(seq=EP_SEQ + 1, count=2)})
bound("status", hdrs={0: ep_hdr(status=5, count=2)})
bound("status-low", hdrs={0: ep_hdr(status=-100001, count=2)})
bound("status-agreed", hdrs={0: ep_hdr(status=-22, count=0)})
bound("chunks", hdrs={0: ep_hdr(count=2, chunks=5)})
bound("chunks-all", hdrs={0: ep_hdr(count=2, chunks=1)})
bound("chunks-agreed", hdrs={0: ep_hdr(status=-22, count=0, chunks=5)})
bound("rows", counts=(1, 1), ecounts=[[40, 1], [2, 0]])
bound("token", recs={(0, 1): ([3, -1], [1.0, 0.0], 4)})
bound("token-neg", recs={(0, 1): ([3, -1], [1.0, 0.0], -1)})
bound("expert", recs={(0, 1): ([3, 4], [1.0, 0.0])})
bound("expert-neg", recs={(0, 1): ([3, -2], [1.0, 0.0])})
bound("more", recs={(0, 1): ([3, 3], [1.0, 0.0])})
bound("fewer", recs={(0, 1): ([-1, -1], [1.0, 0.0])})
bound("combine-count", chdrs={0: ep_hdr(count=3)})
bound("combine-seq", chdrs={0: ep_hdr(seq=EP_SEQ - 1, count=2)})
bound("combine-agreed", chdrs={0: ep_hdr(status=-34)})

# ---- fuzz_coll_hdrs: ranks-1, rank, stride, my header, the slots ----
def arhdr(seq, rows, cols, status, op):
    return struct.pack("<QQQiI", seq, rows, cols, status, op) + bytes(32)


for size, rank in ((2, 0), (4, 3)):
    stride = 64 * 1
    mine = arhdr(5, 2, 8, 0, 3)
    slots = b"".join(arhdr(5, 2, 8, 0, 3).ljust(stride + 64, b"\0") for r in range(size))
    put("fuzz_coll_hdrs", "agree-%d" % size, bytes([size - 1, rank, 1]) + mine + slots)
mine = arhdr(9, 1, 4, 0, 1)
slots = arhdr(9, 1, 4, 0, 1) + arhdr(9, 1, 4, -22, 1) + arhdr(9, 2, 4, 0, 1)
put("fuzz_coll_hdrs", "error", bytes([2, 0, 0]) + mine + slots)

# ---- fuzz_rmsnorm: flags, cols, rows, eps/offset/bound bits, seed, then
# (place, fp32 bits) pairs for x and for gamma ----
def norm(name, flags, cols, rows, e, seed, xs=(), gs=()):
    data = struct.pack(">BHBBI", flags, cols, rows - 1, e, seed)
    data += bytes([len(xs)]) + b"".join(struct.pack(">HI", at, b) for at, b in xs)
    data += bytes([len(gs)]) + b"".join(struct.pack(">HI", at, b) for at, b in gs)
    put("fuzz_rmsnorm", name, data)


def f32(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


BF16, F32 = 0, 1
OUT_F32, OUT_BF16, OUT_FP8 = 0, 2, 4
RES, ONE_ROW = 8, 16
EPS6, OFFSET, UB, POW2, NT = 1, 0x10, 0x20, 0x80, 0x08
for i, (fl, cols) in enumerate(((BF16 | OUT_FP8, 7168), (BF16 | OUT_FP8 | RES, 7168),
                                (F32 | OUT_FP8, 2880), (BF16 | OUT_BF16, 7168),
                                (F32 | OUT_F32, 100), (BF16 | OUT_FP8, 9000),
                                (BF16 | OUT_FP8 | ONE_ROW, 4096),
                                (BF16 | OUT_FP8 | RES | 0x20, 33))):
    norm("plain-%d" % i, fl, cols, 3, EPS6, 0x12345 + i)
norm("bound", BF16 | OUT_FP8, 7168, 2, EPS6 | UB | POW2 | NT, 7)
norm("offset", BF16 | OUT_BF16 | RES, 4096, 4, EPS6 | OFFSET | NT, 8)
# h * g finite, y past the largest float
norm("y-overflow", BF16 | OUT_FP8, 7168, 2, EPS6, 0x03080001,
     xs=[(100, f32(0.75))], gs=[(100, f32(-3.0e38))])
norm("nan-x", BF16 | OUT_FP8, 7168, 2, EPS6, 9, xs=[(5, 0x7fc00000)])
norm("inf-x", F32 | OUT_FP8, 7168, 2, EPS6, 10, xs=[(7000, f32(float("inf")))])
norm("nan-gamma", BF16 | OUT_BF16, 7168, 2, EPS6, 11, gs=[(3, 0xffc00001)])
# tiny rows, eps 0: 1 / rms far above 1
norm("tiny", BF16 | OUT_FP8, 7168, 2, 0, 0x283c0001)
