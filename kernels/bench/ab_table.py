#!/usr/bin/python3
"""A/B table of cuda_bench runs: binaries run alternately, several rounds.

Reads each run, given as LABEL=FILE pairs (the same label once a round):
the results.json that `cuda_bench --out` wrote (times to 0.01 us), or
cuda_bench's stdout (its `decode` and `prologue` lines, times to 0.1 us).
Prints one row a shape: each label's times over the rounds (min-max), and
each later label's change against the first label's median. A change
smaller than the spread of the rounds is noise: run the same binary under
two labels to see the spread. kernels/cuda/ab_on_device.sh runs the
binaries on the GPU machine and calls it; RESULTS.md's A/B figures are
made this way (the binaries alternately, same data, twice or more).
Standard library only.

    kernels/bench/ab_table.py old=r1_old.json new=r1_new.json old=r2_old.json new=r2_new.json
"""

import json
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
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror}")
    except UnicodeDecodeError:
        fail(f"{path} is not text; give cuda_bench's results.json or stdout")
    if path.endswith(".json"):
        return shapes_of_json(path, text)
    times = {}
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if match:
            times[" ".join(match.group(1).split())] = float(match.group(2))
    if not times:
        fail(f"{path} has no decode or prologue line of cuda_bench; give the "
             "stdout of a cuda_bench run")
    return times


def shapes_of_json(path, text):
    try:
        results = json.loads(text)
    except json.JSONDecodeError as error:
        fail(f"{path} is not JSON ({error.msg} at line {error.lineno}); give the "
             "results.json that cuda_bench --out wrote")
    times = {}
    for r in results if isinstance(results, list) else []:
        try:
            if r["op"] == "decode":
                shape = (f"decode {r['model']} H={r['H']} b={r['b']} "
                         f"topk={r['topk_main']}+{r['topk_extra']}")
            else:
                shape = f"{r['op']} H={r['H']} b={r['b']}"
            times[shape] = float(r["time_us"])
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: a shape without op, model, H, b or time_us: {r}")
    if not times:
        fail(f"{path} holds no shapes; give the results.json that cuda_bench --out wrote")
    return times


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stdout if argv else sys.stderr)
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
