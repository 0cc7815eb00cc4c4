"""The instructor's process: ``python -m autograder`` and everything only it does.

* ``cli``: the command line; ``driver``: one grading run (the lock, signals, recording);
* ``pool``: local worker processes with a watchdog; ``cluster``: the Dask client;
* ``release``: student versions; ``roster``, ``exports``, ``summary``: the class's records.

Only this process writes the class gradebook and the course folders. It may import
``core``, ``worker`` (to fork workers and render feedback), ``judge`` and ``sandbox``.
"""
