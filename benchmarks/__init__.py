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
* ``backends``: what a ``--backends`` entry names (``ringpg@tcp/hier``) and whether it is
  usable;
* ``tcp_probe``: the raw-TCP ceiling printed beside the table;
* ``table``: nccl-tests style rows and the progress line;
* ``units``: sizes (``256MiB``) and link rates (``1gbit``) as typed on the command line.

What the tests share with these tools (launching ranks, machine facts, what a live
group says about itself) is in ``devkit``, which both import.
"""
