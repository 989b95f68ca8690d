#!/usr/bin/python3
"""Draws the decode figures of a cuda_bench results.json at one batch size.

One bar group per shape (model, heads): the measured time, the time the
shape's cache rows take at the run's random-row gather ceiling (no decode
can be faster), and the target and DeepSeek's FlashMLA figure where
there is one. Standard library and gnuplot only.

    kernels/bench/plot_results.py [--results kernels/bench/results.json]
        [--b 128] [--out kernels/bench/results_b128.png]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

# FlashMLA (SM90 sparse FP8 decode, MODEL1, sink on) on an H200, as first measured:
# it runs H = 64 and 128 only; a rank with fewer heads pays its H = 64 time.
FLASHMLA_US = {
    ("V4-Flash", 64): {64: 44.4, 128: 46.3, 512: 174.0},
    ("V4-Pro", 128): {64: 53.9, 128: 104.0, 512: 408.0},
}
# The targets: for H <= 32 at every b, 85% of the run's gather ceiling
# counting the rows read (issue 20); V4-Pro H = 128 at most 90 us at b = 128
# and 360 at b = 512 (issue 20); V4-Flash H = 64 faster than FlashMLA at
# b = 128 (issue 4). Other shapes have none.
TARGET_US = {("V4-Flash", 64): {128: 46.0}, ("V4-Pro", 128): {128: 90.0, 512: 360.0}}
MEMORY_BOUND_SHARE_OF_GATHER = 0.85


def fail(message):
    print(f"plot_results: {message}", file=sys.stderr)
    sys.exit(2)


def load_rows(path, b):
    try:
        with open(path) as f:
            results = json.load(f)
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        fail(f"{path} is not JSON ({error.msg} at line {error.lineno}); "
             "give the results.json that cuda_bench --out wrote")
    if not isinstance(results, list):
        fail(f"{path} holds no list of shapes; give the results.json that "
             "cuda_bench --out wrote")
    decode = [r for r in results if isinstance(r, dict) and r.get("op") == "decode"]
    sizes = sorted({r.get("b") for r in decode if isinstance(r.get("b"), int)})
    rows = [r for r in decode if r.get("b") == b]
    if not rows:
        fail(f"{path} has no decode shape at b = {b}; it has b = "
             f"{', '.join(map(str, sizes)) or 'none'}")
    needed = ("model", "H", "time_us", "gbps", "copy_gbps_ceiling", "gather_gbps_ceiling")
    for r in rows:
        missing = [k for k in needed if k not in r]
        if missing:
            fail(f"{path}: the shape {r.get('model')} H={r.get('H')} b={b} lacks "
                 f"{', '.join(missing)}")
    return sorted(rows, key=lambda r: (r["model"], r["H"]))


def table(rows, b):
    """Lines of the data file: label, measured, gather floor, target, FlashMLA."""
    lines = []
    for r in rows:
        key = (r["model"], r["H"])
        cache_bytes_us = r["time_us"] * r["gbps"]  # bytes / 1000, so / GB/s gives us
        floor = cache_bytes_us / r["gather_gbps_ceiling"]
        if r["H"] <= 32:
            target = floor / MEMORY_BOUND_SHARE_OF_GATHER
        else:
            target = TARGET_US.get(key, {}).get(b)
        reference = FLASHMLA_US.get(key, {}).get(b)
        if reference is None and r["model"] == "V4-Flash" and r["H"] < 64:
            reference = FLASHMLA_US[("V4-Flash", 64)].get(b)  # padded to 64 heads
        cell = lambda v: "NaN" if v is None else f"{v:.2f}"
        lines.append(f'"{r["model"]}\\nH={r["H"]}" {r["time_us"]:.2f} {floor:.2f} '
                     f"{cell(target)} {cell(reference)}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="kernels/bench/results.json",
                        help="cuda_bench's results.json (default: %(default)s)")
    parser.add_argument("--b", type=int, default=128,
                        help="the batch size (tokens) to draw (default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help="the PNG to write (default: results_b<B>.png beside --results)")
    args = parser.parse_args()
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        fail("gnuplot is not installed (Debian: apt-get install gnuplot-nox)")
    rows = load_rows(args.results, args.b)
    out = args.out or os.path.join(os.path.dirname(args.results) or ".",
                                   f"results_b{args.b}.png")
    first = rows[0]
    title = (f"Sparse MLA decode, b = {args.b} tokens, {first.get('gpu', 'GPU')} "
             f"(commit {first.get('commit', '?')}, {first.get('date', '?')})")
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "decode.dat")
        with open(data, "w") as f:
            f.write("\n".join(table(rows, args.b)) + "\n")
        script = f"""
set terminal pngcairo size 1200,520 font ",11"
set output "{out}"
set title "{title}"
set ylabel "time (us), lower is better"
set yrange [0:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key top left box
set grid ytics
set xtics nomirror
set bmargin 4
plot "{data}" using 2:xtic(1) title "measured" lc rgb "#1b9e77", \\
     "" using 3 title "rows at the gather ceiling (floor)" lc rgb "#bbbbbb", \\
     "" using 4 title "target" lc rgb "#7570b3", \\
     "" using 5 title "FlashMLA (H < 64: its H=64 time)" lc rgb "#d95f02"
"""
        run = subprocess.run([gnuplot], input=script, text=True, capture_output=True)
        if run.returncode != 0:
            fail(f"gnuplot failed: {run.stderr.strip()}")
    print(f"wrote {out} ({len(rows)} shapes at b = {args.b})")


if __name__ == "__main__":
    main()
