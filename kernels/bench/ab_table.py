#!/usr/bin/python3
"""A/B table of cuda_bench runs: binaries run alternately, several rounds.

Reads cuda_bench's stdout of each run, given as LABEL=FILE pairs in the
order they ran (the same label once a round), takes its `decode` and
`prologue` lines (shape, then the time in us) and prints one row a shape:
each label's times over the rounds (min-max), and each later label's
change against the first label's median. kernels/cuda/ab_on_device.sh runs
the binaries and calls it; METHOD.md's A/B (alternate the binaries, same
data, twice or more) is what it summarises. Standard library only.

    kernels/bench/ab_table.py old=r1_old.log new=r1_new.log old=r2_old.log new=r2_new.log
"""

import re
import statistics
import sys

# "decode V4-Pro   H=128 b=128 topk= 128+1024:     106.5 us  363.1 TFLOP/s ..."
# "prologue H= 64 b= 128 (+32 compressed rows):      5.7 us    3010 GB/s"
LINE = re.compile(r"^((?:decode|prologue)\b.*?):\s+([0-9.]+) us\b")


def fail(message):
    print(f"ab_table: {message}", file=sys.stderr)
    sys.exit(2)


def shapes_of(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror}")
    times = {}
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if match:
            times[" ".join(match.group(1).split())] = float(match.group(2))
    if not times:
        fail(f"{path} has no decode or prologue line of cuda_bench; give the "
             "stdout of a cuda_bench run")
    return times


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    runs = []
    for arg in argv:
        label, sep, path = arg.partition("=")
        if not sep or not label or not path:
            fail(f"'{arg}' is not LABEL=FILE (for example old=round1_old.log)")
        runs.append((label, shapes_of(path)))
    labels = list(dict.fromkeys(label for label, _ in runs))
    if len(labels) < 2:
        fail("an A/B needs runs of at least two labels")
    times = {label: {} for label in labels}  # label -> shape -> [us]
    for label, shapes in runs:
        for shape, us in shapes.items():
            times[label].setdefault(shape, []).append(us)
    shapes = list(dict.fromkeys(s for _, found in runs for s in found))
    rounds = {label: sum(1 for l, _ in runs if l == label) for label in labels}
    print("us, min-max over the rounds (" +
          ", ".join(f"{label}: {rounds[label]}" for label in labels) +
          "); change: median against " + labels[0])
    header = ["shape"] + labels + [f"{label} vs {labels[0]}" for label in labels[1:]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" + "---:|" * (len(header) - 1))
    for shape in shapes:
        cells = [shape]
        for label in labels:
            values = times[label].get(shape)
            cells.append("-" if not values else
                         f"{min(values):.1f}" if min(values) == max(values) else
                         f"{min(values):.1f}-{max(values):.1f}")
        base = times[labels[0]].get(shape)
        for label in labels[1:]:
            values = times[label].get(shape)
            if not base or not values:
                cells.append("-")
                continue
            change = statistics.median(values) / statistics.median(base) - 1.0
            cells.append(f"{100.0 * change:+.1f}%")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
