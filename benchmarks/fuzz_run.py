"""One fuzz case run and judged (``benchmarks/fuzz.py``): its files written, the command line
or API call made, and the outcome: ok, clean error, bare message, traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from fuzz_docs import REPO, SMALL

#: Fragments of messages that Python, numpy or pandas write: an error showing one of these
#: tells the user nothing about their input (issue 31: "tuple.index(x): x not in tuple").
BARE = re.compile(r"not in tuple|not in list|too large to convert|invalid literal for|"
                  r"could not convert|has no attribute|unsupported operand|object is not|"
                  r"index out of range|division by zero|unhashable type|must be real number|"
                  r"argument must be|cannot convert float|out of bounds for|NoneType|"
                  r"Maximum allowed dimension|array is too big|"
                  r"^\W*\w*\W*$", re.I)


# ========================================================================= one case, run
def _materialize(case: dict) -> bool:
    """Write the case's files into the current directory; False when the case cannot be
    made here (chmod 000 does not stop root)."""
    for name, content in case.get("files", {}).items():
        if isinstance(content, tuple):
            _, head, line, times = content
            with open(name, "wb") as fh:
                fh.write(head)
                chunk = line * 4096
                for _ in range(times // 4096):
                    fh.write(chunk)
        else:
            Path(name).write_bytes(content.encode() if isinstance(content, str) else content)
    special = case.get("special")
    if special in ("dir", "out:dir"):
        os.makedirs("config.yaml" if special == "dir" else "d", exist_ok=True)
    elif special == "fifo":
        os.mkfifo("config.yaml")
    elif special == "unreadable":
        os.chmod("config.yaml", 0)
        if os.access("config.yaml", os.R_OK):
            return False
    elif special == "symlink":
        os.symlink(REPO / "examples" / (SMALL[0] + ".yaml"), "config.yaml")
    elif special == "symlink-loop":
        os.symlink("config.yaml", "config.yaml")
    elif special == "out:symlink":
        Path("target.json").write_text("old\n")
        os.symlink("target.json", "out.json")
    elif special == "out:dangling":
        os.symlink("nowhere/target.json", "out.json")
    return True


def _resolve(argv: list) -> list[str]:
    return [str(REPO / a[1:]) if isinstance(a, str) and a.startswith("@") else str(a)
            for a in argv]


def _frames(tb) -> tuple[str, str]:
    """(last ddlsim frame, last frame) as 'path:line func'."""
    frames = traceback.extract_tb(tb)
    fmt = (lambda f: f"{os.path.relpath(f.filename, REPO) if f.filename.startswith(str(REPO)) else Path(f.filename).name}:{f.lineno} {f.name}")
    own = [f for f in frames if "/ddlsim/" in f.filename]
    return (fmt(own[-1]) if own else "-", fmt(frames[-1]) if frames else "-")


def _from_exception(exc: BaseException) -> dict:
    own, last = _frames(exc.__traceback__)
    try:  # the message may be huge (a repr of an alias bomb): never format all of it
        msg = str(exc)[:500]
    except Exception:  # noqa: BLE001
        msg = "<str() failed>"
    frames = traceback.format_list(traceback.extract_tb(exc.__traceback__)[-3:])
    tail = "".join(frames).splitlines() + [f"{type(exc).__name__}: {msg}"]
    outcome = "memory" if isinstance(exc, MemoryError) else "traceback"
    return {"outcome": outcome, "error": type(exc).__name__, "frame": own, "last": last,
            "tail": "\n".join(tail)}


_NONFINITE = re.compile(r"\b(NaN|-?Infinity|nan|-?inf)\b")


def _judged(exc: BaseException) -> dict:
    """The outcome of an exception the CLI would print as its ``error:`` paragraph (the
    worker runs it with ``DDLSIM_DEBUG=1``, so it arrives here whole)."""
    from ddlsim.errors import DDLSimError

    described = (isinstance(exc, OSError) and exc.strerror) or isinstance(
        exc, (UnicodeDecodeError, RecursionError))
    if isinstance(exc, DDLSimError) or described:
        text = str(exc)[:2000]
        if isinstance(exc, DDLSimError) and BARE.search(text):
            return {**_from_exception(exc), "outcome": "bare message"}
        return {"outcome": "clean error"}
    if isinstance(exc, (ValueError, OverflowError)) and not isinstance(exc, MemoryError):
        return {**_from_exception(exc), "outcome": "bare message"}
    return _from_exception(exc)


def _run_cli(argv: list[str]) -> dict:
    from typer.testing import CliRunner

    from ddlsim.cli import app
    res = CliRunner().invoke(app, argv)
    out = res.output
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        return _judged(res.exception)
    lines = [ln.strip(" │╭╮╰╯─") for ln in out.splitlines()]
    differs = res.exit_code == 1 and "--diff-mpip" in argv  # a diff that found differences
    if res.exit_code == 0 or differs:
        return {"outcome": "ok", "nonfinite": argv[:1] == ["predict"] and bool(
            _NONFINITE.search(out))}
    # ddlsim's "error: …", click's usage error (an "Error" box) or the help of a bare group
    said = any(ln.lower().startswith("error") or ln.startswith("Usage:") for ln in lines)
    if res.exit_code == 2 and "Traceback" not in out and said:
        return {"outcome": "clean error"}
    first = next((ln for ln in lines if ln), "")
    return {"outcome": "traceback", "error": f"exit {res.exit_code}", "frame": first[:80],
            "last": "-", "tail": "\n".join(out.splitlines()[-8:])}


def _run_api(call: dict) -> dict:
    import ddlsim
    from ddlsim.calibration.readers import read_results
    from ddlsim.errors import DDLSimError

    fn = {"load_config": ddlsim.load_config, "predict": ddlsim.predict,
          "read_results": read_results,
          "sleep": time.sleep, "allocate": bytearray}[call["fn"]]  # the last two test the pool
    try:
        value = fn(*call["args"], **call["kwargs"])
        text = json.dumps(value.to_dict()) if hasattr(value, "to_dict") else (
            value.to_csv() if hasattr(value, "to_csv") else repr(value))
    except DDLSimError as exc:
        return _judged(exc)
    except Exception as exc:  # noqa: BLE001 - anything else is what we are looking for
        return _from_exception(exc)
    return {"outcome": "ok", "nonfinite": call["fn"] == "predict" and bool(
        _NONFINITE.search(text))}


def run_case(case: dict, scratch: str | None = None) -> dict:
    """Run one case in a fresh temporary directory (under ``scratch``), in this process."""
    old, tmp = os.getcwd(), tempfile.mkdtemp(prefix="case-", dir=scratch)
    t0 = time.perf_counter()
    try:
        os.chdir(tmp)
        if not _materialize(case):
            return {"outcome": "skipped", "seconds": 0.0}
        res = _run_cli(_resolve(case["argv"])) if "argv" in case else _run_api(case["api"])
    except MemoryError as exc:
        res = _from_exception(exc)
    finally:
        os.chdir(old)
        try:
            os.chmod(Path(tmp, "config.yaml"), 0o600, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = time.perf_counter() - t0
    return res
