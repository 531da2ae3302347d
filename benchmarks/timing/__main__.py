"""``python -m benchmarks.timing SUBJECT ...``: see :mod:`benchmarks.timing`."""

from benchmarks.timing import main

main()
