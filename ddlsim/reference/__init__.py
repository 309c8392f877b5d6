"""Reference workloads that really train on this machine, for closing the loop
calibrate → predict → run (``benchmarks/closed_loop.py``, docs/validation.md).

``gpt2``: a numpy GPT-2 (forward, backward, Adam); ``train``: its data-parallel training
under MPI with the seed wiki's four gradient updates. Nothing here is imported by
``import ddlsim``; numpy and mpi4py load when these modules do.
"""
