#!/usr/bin/python3
"""Tests of ncu_roles.py on a small made-up ncu SASS page: the regions at
setmaxnreg and EXIT (or --cuts) with their samples and stalls, the mbarrier
waits, the top instructions, gzipped input, and a clear error (exit 2) for
each kind of bad input. JUnit report by pytest (bench_test_support.py)."""

import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_test_support  # pylint: disable=wrong-import-position

SCRIPT = os.path.join(HERE, "ncu_roles.py")

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "# Samples", "Instructions Executed",
          "stall_barrier", "stall_long_sb", "stall_wait", "stall_barrier (Not Issued)"]
# (source, samples, executed, barrier, long_sb, wait); the "Not Issued"
# column repeats barrier (it must not be counted twice).
CODE = [
    ("LDC R1, c[0x0][0x28]", 2, 10, 0, 0, 2),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", 3, 10, 3, 0, 0),
    ("PREEXIT", 0, 10, 0, 0, 0),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x40", 0, 8, 0, 0, 0),
    ("LDG.E.128.CONSTANT R4, desc[UR4][R2.64]", 1, 80, 0, 0, 1),
    ("SEL R28, R6, R7, !P0", 40, 80, 0, 40, 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR12+0x32510], R29", 1, 80, 0, 1, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xd0", 0, 2, 0, 0, 0),
    ("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR16], RZ, !UPT", 1, 20, 0, 0, 1),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 20, 20, 20, 0, 0),
    ("@P0 EXIT", 0, 10, 0, 0, 0),
    ("EXIT", 0, 10, 0, 0, 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12+0x32510], R29", 0, 5000, 0, 0, 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR12+0x32500], R2", 0, 0, 0, 0, 0),
]


def page(code=CODE, header=HEADER, name="void DecodeWgmmaKernel<1>(DecodeParams)"):
    lines = [f'"Kernel Name","{name}",', ",".join(f'"{h}"' for h in header)]
    for index, (source, samples, executed, barrier, long_sb, wait) in enumerate(code):
        values = [hex(0x1000 + 16 * index), "      " + source, samples, samples, samples,
                  executed, barrier, long_sb, wait, barrier]
        lines.append(",".join(f'"{v}"' for v in values))
    return "\n".join(lines) + "\n"


def run(*args):
    return bench_test_support.run_python(SCRIPT, *args)


class NcuRolesTest(bench_test_support.ScratchTest):
    def test_splits_at_setmaxnreg_and_exit_with_samples_and_stalls(self):
        result = run(self.write("page.csv", page()), "--top", "3")
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertIn("kernel: void DecodeWgmmaKernel<1>(DecodeParams)", out)
        self.assertIn("14 instructions, 68 warp-state samples", out)
        # Before the first setmaxnreg (PREEXIT splits nothing), the producer's
        # region, the consumer's (a predicated EXIT splits nothing), and the
        # retry loops from the EXIT on.
        self.assertRegex(out, r"\[\s+0,\s+3\)\s+5\s+7\.4%  starts 'LDC.*barrier 3, wait 2\n")
        self.assertRegex(out, r"\[\s+3,\s+7\)\s+42\s+61\.8%.*long_sb 41, wait 1\n")
        self.assertRegex(out, r"\[\s+7,\s+11\)\s+21\s+30\.9%.*barrier 20, wait 1\n")
        self.assertRegex(out, r"\[\s+11,\s+14\)\s+0\s+0\.0%  starts 'EXIT'")

    def test_lists_the_waits_that_ran_and_the_top_instructions(self):
        out = run(self.write("page.csv", page()), "--top", "2").stdout
        waits = out.split("mbarrier waits")[1].split("the 2 instructions")[0]
        self.assertRegex(waits, r"6\s+80\s+SYNCS.PHASECHK.TRANS64.TRYWAIT P2")
        self.assertRegex(waits, r"12\s+5000\s+SYNCS")
        self.assertNotIn("0x32500", waits)  # never ran
        top = out.split("the 2 instructions")[1]
        self.assertRegex(top, r"5\s+40\s+80\s+SEL R28.*long_sb 40\n")
        self.assertRegex(top, r"9\s+20\s+20\s+WARPGROUP.DEPBAR.*barrier 20\n")
        self.assertNotIn("LDC", top)

    def test_cuts_replace_the_setmaxnreg_split(self):
        out = run(self.write("page.csv", page()), "--cuts", "5,9", "--top", "0").stdout
        self.assertRegex(out, r"\[\s+0,\s+5\)\s+6\s")
        self.assertRegex(out, r"\[\s+5,\s+9\)\s+42\s")
        self.assertRegex(out, r"\[\s+9,\s+14\)\s+20\s")
        self.assertNotIn("instructions with the most samples", out)

    def test_reads_gzipped_pages(self):
        path = self.write("page.csv.gz", gzip.compress(page().encode()))
        result = run(path, "--top", "1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("68 warp-state samples", result.stdout)

    def test_help_says_how_to_make_the_page(self):
        result = run("--help")
        self.assertEqual(result.returncode, 0)
        self.assertIn("--page source --csv --print-source", result.stdout)
        self.assertIn("--cuts", result.stdout)

    def assertRefused(self, result, *phrases):
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "")
        for phrase in phrases:
            self.assertIn(phrase, result.stderr)

    def test_refuses_a_missing_file(self):
        self.assertRefused(run(os.path.join(self.work, "none.csv")), "cannot read")

    def test_refuses_a_csv_that_is_not_the_sass_page(self):
        path = self.write("other.csv", '"ID","Metric Name","Metric Value"\n"0","Duration","1"\n')
        self.assertRefused(run(path), "no 'Warp Stall Sampling (All Samples)' column",
                           "--page source --csv --print-source sass")

    def test_refuses_a_page_without_instructions(self):
        self.assertRefused(run(self.write("empty.csv", page(code=[]))), "lists no instructions")

    def test_refuses_counters_that_are_not_numbers(self):
        bad = page().replace('"40"', '"forty"', 1)
        self.assertRefused(run(self.write("bad.csv", bad)), "non-number")

    def test_refuses_a_page_without_the_executed_or_source_column(self):
        for column in ("Instructions Executed", "Source"):
            header = [column + " (renamed)" if h == column else h for h in HEADER]
            self.assertRefused(run(self.write("cols.csv", page(header=header))),
                               f"lacks the column(s) {column}")

    def test_refuses_a_page_of_two_kernels(self):
        self.assertRefused(run(self.write("two.csv", page() + page())), "holds 2 kernels",
                           "--launch-count 1")

    def test_refuses_bad_cuts_and_a_broken_gzip(self):
        path = self.write("page.csv", page())
        self.assertRefused(run(path, "--cuts", "a,b"), "--cuts takes instruction indices")
        self.assertRefused(run(path, "--cuts", "5,14"), "--cuts 14", "0..13")
        self.assertRefused(run(path, "--top", "-1"), "--top takes a count")
        broken = self.write("broken.csv.gz", gzip.compress(page().encode())[:40])
        self.assertRefused(run(broken), "broken gzip")


def main():
    return bench_test_support.run(__file__)


if __name__ == "__main__":
    sys.exit(main())
