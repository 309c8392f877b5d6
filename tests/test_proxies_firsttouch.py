"""benchmarks/proxies_firsttouch.py: its sizes are the proxies' and it prints one line each."""

from __future__ import annotations

import re
import subprocess
import sys

from benchscripts import BENCH  # puts benchmarks/ on sys.path

import proxies_firsttouch as ft


def test_sizes_are_the_proxies_p2p_messages():
    # P2PSIZE floats (comm_only/gpt2_large.cpp:22, comm_only/bert_large.cpp:22) × 4 B
    assert ft.PROXY_BYTES == {"gpt2_large": 3_235_840, "bert_large": 4_198_400}


def test_one_size_prints_both_copies_and_the_cost_per_page():
    proc = subprocess.run([sys.executable, str(BENCH / "proxies_firsttouch.py"), "--bytes",
                           "262144", "--repeats", "3"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"--bytes: 262144 B, copy into fresh memory \d+\.\d{3} ms CPU, into "
                        r"the same memory again \d+\.\d{3} ms; first touch -?\d+\.\d\d us per "
                        r"4 KiB page \(mean of 3\)\n", proc.stdout)


def test_a_size_under_a_page_is_refused():
    proc = subprocess.run([sys.executable, str(BENCH / "proxies_firsttouch.py"), "--bytes",
                           "100"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "at least one page (4096 B)" in proc.stderr
