"""What a copy into fresh memory costs on this machine: the comm_only pipeline proxies
(spcl/DNN-cpp-proxies, comm_only/gpt2_large.cpp and bert_large.cpp, ``run_pipeline``)
``calloc`` a new send and receive buffer every iteration and never free them, so the first
message an iteration receives lands in pages the kernel has never mapped: each 4 KiB page
faults, and the kernel zeroes it, inside the copy. A calibration (``ddlsim calibrate comm``)
reuses warm buffers and does not see it.

    python benchmarks/proxies_firsttouch.py                  # the proxies' two message sizes
    python benchmarks/proxies_firsttouch.py --bytes 4198400 --repeats 50

Each repetition copies ``--bytes`` into a new ``numpy.zeros`` array (glibc serves a
request this large from fresh ``mmap`` pages, as the proxies' ``calloc``; numpy.zeros calls
calloc) and then into the same array again, timing both with the process's CPU clock
(``time.process_time``: the page faults are kernel time charged to this process, so other
jobs on the machine change little). Prints the means (as ``ddlsim calibrate first-touch``:
the proxies print a mean over their iterations) and the difference per 4 KiB page.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from ddlsim.calibration.firsttouch import copy_twice

#: P2PSIZE floats × 4 B of comm_only/gpt2_large.cpp:22 and comm_only/bert_large.cpp:22
PROXY_BYTES = {"gpt2_large": 808_960 * 4, "bert_large": 1_049_600 * 4}
PAGE = 4096  # bytes: x86-64 base page (getconf PAGESIZE)


def first_touch(nbytes: int, repeats: int) -> tuple[float, float]:
    """Mean CPU seconds of copying ``nbytes`` into fresh memory and into the same memory
    again.

    Parameters
    ----------
    nbytes : int
        Bytes per copy.
    repeats : int
        Fresh buffers to copy into.

    Returns
    -------
    (float, float)
        Seconds of the first copy (pages faulted in) and of the second (pages mapped).
    """
    src = np.ones(nbytes, dtype=np.uint8)
    fresh, warm, keep = [], [], []
    for _ in range(repeats):
        dst = np.zeros(nbytes, dtype=np.uint8)
        first, again = copy_twice(dst, src)
        fresh.append(first)
        warm.append(again)
        keep.append(dst)  # as the proxies: never freed, so the next buffer is fresh too
    return statistics.mean(fresh), statistics.mean(warm)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, help="one size instead of the proxies' two")
    ap.add_argument("--repeats", type=int, default=30, help="fresh buffers per size")
    args = ap.parse_args(argv)
    if args.repeats < 1 or (args.bytes is not None and args.bytes < PAGE):
        ap.error(f"--repeats {args.repeats} must be >= 1 and --bytes {args.bytes} at least "
                 f"one page ({PAGE} B)")
    sizes = {"--bytes": args.bytes} if args.bytes else PROXY_BYTES
    for name, nbytes in sizes.items():
        fresh, warm = first_touch(nbytes, args.repeats)
        print(f"{name}: {nbytes} B, copy into fresh memory {fresh * 1e3:.3f} ms CPU, into the "
              f"same memory again {warm * 1e3:.3f} ms; first touch "
              f"{(fresh - warm) / (nbytes / PAGE) * 1e6:.2f} us per 4 KiB page "
              f"(mean of {args.repeats})")


if __name__ == "__main__":
    main()
