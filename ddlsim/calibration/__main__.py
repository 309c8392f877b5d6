"""``python -m ddlsim.calibration …`` — what ``mpirun``/``torchrun`` launch on every rank."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m ddlsim.calibration")
