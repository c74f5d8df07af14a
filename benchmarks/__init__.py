"""ringpg's benchmark instrument: ``bench`` (sweep), ``compare`` (torchrun job), ``netns`` (emulated cluster).

Run from the repository root, e.g. ``python -m benchmarks.bench --check``; see
``benchmarks/README.md``.

Everything that decides *what* a number means lives once, in the modules both tools
share:

* ``cases``: the ops, dtypes and cases measured, and the nccl-tests bandwidth factors;
* ``data``: deterministic integer inputs and the exact expected result on every rank;
* ``protocol``: the torch-free part: which data every buffer holds, the iteration rule
  and the clock identity, shared with the MPI peers;
* ``peers``: MPI peers (``--peers``): finding their venvs, launching them, taking turns;
* ``mpi_peer``: what runs under each MPI's ``mpiexec`` (numpy and mpi4py, no torch);
* ``timing``: backends alternating on the same buffers, and the figures they make;
* ``backends``: what a ``--backends`` entry names (``ringpg@tcp/hier``), whether it is
  usable, and what a live group says about itself;
* ``machine``: the facts every run prints first, and threads per rank;
* ``launch``: free ports, ranks that die with their launcher, torchrun's environment;
* ``tcp_probe``: the raw-TCP ceiling printed beside the table;
* ``table``: nccl-tests style rows and the progress line;
* ``units``: sizes (``256MiB``) and link rates (``1gbit``) as typed on the command line.

The tests import a few of these too (``free_port``, ``transport_of``, ``global_rank``,
``default_tcp_congestion``) rather than keep copies of their own.
"""
