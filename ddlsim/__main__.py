"""``python -m ddlsim …``: the ``ddlsim`` command, where its script is not on the PATH."""

from .cli import main

main()
