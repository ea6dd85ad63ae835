"""Where kernels run: the torch worker (the only code that imports torch and FBGEMM, always in a
subprocess), process supervision, and the executors that place workers on this host or on a Ray cluster."""
