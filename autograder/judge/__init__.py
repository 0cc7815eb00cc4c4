"""Execution and verdicts, in a trusted process (a worker, or nbgrader's own autograde).

* ``execute``: :class:`~autograder.judge.execute.LimitedExecute`, nbgrader's executor with
  limits, recovery and the outside judge;
* ``verdict``: the judge itself: test cells run here, the student's functions are called in
  the kernel through the probe;
* ``transport``: :class:`~autograder.judge.transport.KernelTransport`, the judge's line to
  one kernel (a probe request out, its decoded reply back);
* ``kernel_manager``: every kernel starts in the sandbox (:mod:`autograder.sandbox`).

It may import ``core``, ``sandbox`` and the probe's source (``kernel``), nothing of ``worker``
or ``host``.
"""
