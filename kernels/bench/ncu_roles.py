#!/usr/bin/python3
"""Where a warp-specialised kernel's warps wait, from ncu's SASS page.

Reads the CSV that `ncu --import REPORT --page source --csv --print-source
sass` prints for one kernel (gzipped or not). Take the report of one launch
with `--section SourceCounters --clock-control none -k regex:Decode
--launch-skip 2 --launch-count 1`.

A warp-specialised kernel's roles (the decode kernels' consumer and producer
warpgroups) run their own code after a `setmaxnreg` (USETMAXREG in SASS,
predicated or not), so the code is split into regions at those instructions
and at each unpredicated EXIT (after the last one come the out-of-line retry
loops of the mbarrier waits), or at the instruction indices --cuts gives
(the indices this report prints, 0 = the kernel's first instruction). For
each region: its warp-state samples, their share of the kernel's, and the
main stall reasons. Then the mbarrier waits, with how often each try_wait
ran (the copies in the retry loops count the retries: a wait that ran many
times more than the code around it is a role waiting for another), and the
instructions with the most samples, in address order. RESULTS.md's section
"Measured after f3e723b, led by ncu's warp-state samples" is read from it.
Standard library only.

    kernels/bench/ncu_roles.py SASS.csv[.gz] [--top 30] [--cuts 140,1100]
"""

import argparse
import csv
import gzip
import io
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
SOURCE = "Source"
HOW_TO = ("give the CSV of `ncu --import REPORT.ncu-rep --page source --csv "
          "--print-source sass` for a report taken with --section SourceCounters")


def fail(message):
    print(f"ncu_roles: {message}", file=sys.stderr)
    sys.exit(2)


def read_rows(path):
    """The kernel's name and its instructions (dicts), in address order."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror}")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as error:
            fail(f"{path} is a broken gzip file ({error})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{path} is not text; {HOW_TO}")
    rows = list(csv.reader(io.StringIO(text)))
    # ncu puts the kernel's name on the first line, the header on the second.
    header_at = next((i for i, row in enumerate(rows[:3]) if SAMPLES in row), None)
    if header_at is None:
        fail(f"{path} has no '{SAMPLES}' column; {HOW_TO}")
    name = rows[0][1] if header_at == 1 and len(rows[0]) > 1 else "?"
    header = rows[header_at]
    missing = [c for c in (SOURCE, EXECUTED) if c not in header]
    if missing:
        fail(f"{path} lacks the column(s) {', '.join(missing)}; {HOW_TO}")
    kernels = sum(1 for row in rows if row and row[0] == "Kernel Name")
    if kernels > 1:
        fail(f"{path} holds {kernels} kernels; profile one launch of one kernel "
             "(-k regex:NAME --launch-count 1)")
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    instructions = []
    for row in rows[header_at + 1:]:
        if len(row) != len(header):
            continue
        item = dict(zip(header, row))
        try:
            item[SAMPLES] = int(item[SAMPLES] or 0)
            item[EXECUTED] = int(item[EXECUTED] or 0)
            for s in stalls:
                item[s] = int(item[s] or 0)
        except ValueError:
            fail(f"{path}: a row with a non-number in its counters: {row[:3]}")
        item[SOURCE] = item[SOURCE].strip()
        instructions.append(item)
    if not instructions:
        fail(f"{path} lists no instructions; {HOW_TO}")
    return name, instructions, stalls


def top_stalls(items, stalls, count):
    totals = {s: sum(i[s] for i in items) for s in stalls}
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{s[len('stall_'):]} {v}" for s, v in ranked[:count] if v > 0)


def region_bounds(instructions, cuts):
    if cuts:
        bounds = sorted({0, len(instructions), *[c for c in cuts if 0 < c < len(instructions)]})
    else:
        marks = [i for i, item in enumerate(instructions)
                 if item[SOURCE].startswith(("USETMAXREG", "EXIT")) or " USETMAXREG" in item[SOURCE]]
        bounds = sorted({0, len(instructions), *marks})
    return list(zip(bounds, bounds[1:]))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu's SASS source page as CSV (.gz allowed)")
    parser.add_argument("--top", type=int, default=30,
                        help="instructions with the most samples to list (default 30)")
    parser.add_argument("--cuts", default="",
                        help="comma-separated instruction indices to split at instead "
                             "of the setmaxnreg and EXIT instructions")
    args = parser.parse_args(argv)
    try:
        cuts = [int(c) for c in args.cuts.split(",") if c.strip()]
    except ValueError:
        fail(f"--cuts takes instruction indices such as 0,140,1100, not '{args.cuts}'")
    if args.top < 0:
        fail("--top takes a count of 0 or more")

    name, instructions, stalls = read_rows(args.csv)
    outside = [c for c in cuts if not 0 < c < len(instructions)]
    if outside:
        fail(f"--cuts {', '.join(map(str, outside))}: the kernel's instructions are "
             f"0..{len(instructions) - 1}, and a cut at 0 or the end splits nothing")
    total = sum(i[SAMPLES] for i in instructions)
    print(f"kernel: {name}")
    print(f"{len(instructions)} instructions, {total} warp-state samples")
    print("\nregions (split at setmaxnreg and EXIT, or --cuts): samples, share, main stalls")
    for a, b in region_bounds(instructions, cuts):
        items = instructions[a:b]
        samples = sum(i[SAMPLES] for i in items)
        first = items[0][SOURCE][:40]
        share = 100.0 * samples / total if total else 0.0
        print(f"  [{a:5d}, {b:5d}) {samples:7d} {share:5.1f}%  starts '{first}'  "
              f"{top_stalls(items, stalls, 5)}")
    print("\nmbarrier waits (try_wait; executions: the retry loops repeat them):")
    for index, item in enumerate(instructions):
        if "TRYWAIT" in item[SOURCE] and item[EXECUTED] > 0:
            print(f"  {index:5d} {item[EXECUTED]:10d}  {item[SOURCE][:70]}")
    if args.top:
        print(f"\nthe {args.top} instructions with the most samples (index, samples, "
              "executions, instruction, main stalls):")
        ranked = sorted(range(len(instructions)), key=lambda i: -instructions[i][SAMPLES])
        for index in sorted(ranked[:args.top]):
            item = instructions[index]
            if item[SAMPLES] == 0:
                continue
            print(f"  {index:5d} {item[SAMPLES]:6d} {item[EXECUTED]:9d}  {item[SOURCE][:58]:58s}  "
                  f"{top_stalls([item], stalls, 2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
