"""Traces in, traces out (docs/traces.md): a PyTorch profiler (Kineto) trace's measured
compute put into ddlsim's trace (:mod:`.kineto`, :mod:`.measured`, :mod:`.replay`), Chakra
execution traces written and read (:mod:`.chakra`), and MPI call logs replayed
(:mod:`.mpilog`)."""
