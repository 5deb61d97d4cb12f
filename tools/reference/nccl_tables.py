"""The collective model against the measured nccl-tests tables of docs/costs.md: prints (or
writes into the doc) the error per band of sizes and the table of every size.

    python3 tools/reference/nccl_tables.py [--lib PATH] [--write docs/costs.md]

Each table of docs/costs.md that this script makes follows a line `<!-- nccl_tables.py: NAME
-->`; --write replaces the table under each such line and leaves every other line as it is.
The model is libfsdp's own fsdp_sim_coll_time (through ctypes; --lib, default the build's
.libs/libfsdp.so), for an all-reduce of 8 ranks on one node, under presets and JSON profiles.

The measurements, [AZH] and [AZA] of docs/costs.md: Azure/AI-benchmarking-guide,
Azure_Results/ND_H100_v5_results.md and ND_A100_v4_results.md (2024-09-24/25), nccl-tests
all_reduce_perf busbw, in place, 1 KiB to 8 GiB, NCCL 2.18.5, run by that repository's
Benchmarks/NCCLBandwidth.py of the same days as `NCCL_ALGO=<algo> all_reduce_perf -b 8 -e 8G
-f 2 -g 8 -n 40` for Tree, Ring, NVLS and NVLSTree; the H100 page publishes the NVLS run. The
time of a size is S / (busbw x 8 / 14).

Rows of the band table, each a profile and nothing fitted to these tables:
- the presets (NCCL 2.30's tuning), and the previous model (NCCL's tuning time alone);
- the -nccl2.18 presets (the tables' NCCL);
- as run: the same with NCCL_ALGO as the benchmark set it (every other algorithm priced out at
  1 s of latency), the floor taken again from the 1 KiB row by the presets' rule;
- as timed: nccl-tests times 40 back-to-back iterations of one host thread launching the 8
  GPUs' calls (src/common.cu, -g 8), so a size takes the longer of that thread's time per
  iteration (the 1 KiB row) and the device's (latency and bytes), not their sum.
"""
import argparse
import ctypes
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))

# busbw, GB/s, 1 KiB x 2^k
AZH = [0.07, 0.14, 0.27, 0.53, 0.95, 1.71, 2.72, 5.40, 10.86, 21.35, 43.70, 81.93, 128.73, 172.13,
       234.45, 295.53, 361.78, 400.61, 423.38, 438.46, 466.35, 472.36, 475.54, 478.87]
AZA = [0.04, 0.08, 0.17, 0.33, 0.67, 1.37, 2.70, 5.15, 10.11, 19.24, 36.22, 53.54, 71.43, 89.99,
       109.22, 132.77, 166.63, 174.18, 213.87, 221.58, 228.10, 230.22, 230.48, 231.58]
N = 8
ALL_REDUCE = 2
ALGOS = ["ring", "tree", "nvls", "nvls_tree", "pat"]
PROTOS = ["ll", "ll128", "simple"]
OUT = '"base_latency_s": {"ring": [1, 1, 1]}'
PREVIOUS = ('"algorithms": ["ring", "tree", "nvls"], "channels": 12, "call_floor_s": 0, '
            '"channel_bytes": [0, 0, 0], "sms_per_channel": 0')


class Cost(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_int), ("proto", ctypes.c_int), ("latency_s", ctypes.c_double),
                ("algo_bytes_per_s", ctypes.c_double), ("time_s", ctypes.c_double),
                ("floor_s", ctypes.c_double), ("channels", ctypes.c_int)]


class Model:
    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        self.lib.fsdp_sim_coll_time.restype = ctypes.c_double
        self.lib.fsdp_sim_coll_time.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                                ctypes.c_int, ctypes.c_double,
                                                ctypes.POINTER(Cost)]

    def profile(self, arg):
        """A preset, or JSON text (through a file: the library reads a profile from one)."""
        buf = ctypes.create_string_buffer(1 << 16)
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            if arg.startswith("{"):
                f.write(arg)
                f.flush()
                arg = f.name
            if self.lib.fsdp_sim_profile_from_arg(arg.encode(), buf) != 0:
                sys.exit("bad profile %s" % arg)
        return buf

    def rows(self, arg, sizes):
        p = self.profile(arg)
        out = []
        for s in sizes:
            c = Cost()
            self.lib.fsdp_sim_coll_time(p, ALL_REDUCE, N, 1, float(s), ctypes.byref(c))
            out.append(c)
        return out


def measured(busbw):
    return [1024 * 2 ** k / (b * 1e9 * N / (2 * (N - 1))) for k, b in enumerate(busbw)]


def variant(model, base, busbw, nccl="", timed=False):
    """Times of every size: a profile (a preset, or base with these nccl members), the floor taken
    again from the 1 KiB row when nccl prices algorithms out; timed: max(host, device)."""
    sizes = [1024 * 2 ** k for k in range(len(busbw))]
    meas = measured(busbw)
    arg = base if not nccl else '{"base": "%s", "nccl": {%s}}' % (base, nccl)
    rows = model.rows(arg, sizes)
    dev = [c.time_s - c.floor_s for c in rows]
    if timed:
        times = [max(meas[0], d) for d in dev]
    elif nccl and "call_floor_s" not in nccl:
        times = [meas[0] - dev[0] + d for d in dev]
    else:
        times = [c.time_s for c in rows]
    return sizes, meas, times, rows


def bands(sizes, meas, times):
    err = [[], [], []]
    for s, m, t in zip(sizes, meas, times):
        err[0 if s < 64 << 10 else 1 if s <= 16 << 20 else 2].append(abs(t / m - 1))
    out = []
    for e in err:
        e.sort()
        med = (e[(len(e) - 1) // 2] + e[len(e) // 2]) / 2
        out.append("%.1f%% / %.1f%% (%.1f%%)" % (100 * med, 100 * sum(e) / len(e), 100 * e[-1]))
    return out


def size_name(s):
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if s >= unit:
            return "%d %s" % (s // unit, name)
    return "%d B" % s


def how(c):
    return "%s/%s, %d" % (ALGOS[c.algo], PROTOS[c.proto], c.channels)


def band_table(model):
    lines = ["| table | model | < 64 KiB | 64 KiB - 16 MiB | > 16 MiB |",
             "| --- | --- | --- | --- | --- |"]
    runs = [
        ("H100", AZH, [("previous model (NCCL's tuning time alone)", "h100", PREVIOUS, False),
                       ("h100 (NCCL 2.30)", "h100", "", False),
                       ("h100-nccl2.18", "h100-nccl2.18", "", False),
                       ("... as run (NVLS)", "h100-nccl2.18",
                        '"algorithms": ["ring", "nvls"], ' + OUT, False),
                       ("... and as timed", "h100-nccl2.18",
                        '"algorithms": ["ring", "nvls"], ' + OUT, True)]),
        ("A100", AZA, [("previous model (NCCL's tuning time alone)", "a100", PREVIOUS, False),
                       ("a100 (NCCL 2.30)", "a100", "", False),
                       ("a100-nccl2.18", "a100-nccl2.18", "", False),
                       ("... as run if Ring", "a100-nccl2.18", '"algorithms": ["ring"]', False),
                       ("... and as timed", "a100-nccl2.18", '"algorithms": ["ring"]', True),
                       ("... as run if Tree", "a100-nccl2.18",
                        '"algorithms": ["ring", "tree"], ' + OUT, False),
                       ("... and as timed", "a100-nccl2.18",
                        '"algorithms": ["ring", "tree"], ' + OUT, True)]),
    ]
    for table, busbw, variants in runs:
        for name, base, nccl, timed in variants:
            sizes, meas, times, _ = variant(model, base, busbw, nccl, timed)
            lines.append("| %s | %s | %s |" % (table, name, " | ".join(bands(sizes, meas, times))))
    return lines


def size_table(model, new, old, busbw):
    sizes, meas, times, rows = variant(model, new, busbw)
    _, _, old_times, old_rows = variant(model, old, busbw)
    lines = ["| size | measured µs | %s µs | error | algorithm/protocol, channels | %s µs | error |"
             % (new, old), "| --- | --- | --- | --- | --- | --- | --- |"]
    for s, m, t, c, o in zip(sizes, meas, times, rows, old_times):
        lines.append("| %s | %.1f | %.1f | %+.0f%% | %s | %.1f | %+.0f%% |"
                     % (size_name(s), m * 1e6, t * 1e6, 100 * (t / m - 1), how(c), o * 1e6,
                        100 * (o / m - 1)))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(TOP, ".libs", "libfsdp.so"))
    ap.add_argument("--write", metavar="DOC")
    args = ap.parse_args()
    model = Model(args.lib)
    tables = {"bands": band_table(model),
              "h100": size_table(model, "h100-nccl2.18", "h100", AZH),
              "a100": size_table(model, "a100-nccl2.18", "a100", AZA)}
    if not args.write:
        for name, lines in tables.items():
            print("<!-- nccl_tables.py: %s -->" % name)
            print("\n".join(lines) + "\n")
        return
    text = open(args.write).read().split("\n")
    out, i = [], 0
    while i < len(text):
        out.append(text[i])
        m = re.match(r"<!-- nccl_tables.py: (\w+) -->", text[i])
        i += 1
        if m:
            while i < len(text) and text[i] == "":
                i += 1
            while i < len(text) and text[i].startswith("|"):
                i += 1
            out.extend([""] + tables[m.group(1)])
            if i < len(text) and text[i] != "":
                out.append("")
    open(args.write, "w").write("\n".join(out))


if __name__ == "__main__":
    main()
