"""The sandbox launcher and the kernels' cgroups: standard library only.

:mod:`~autograder.sandbox.launcher` is the program that starts every grading kernel
(cgroup, rlimits, then bubblewrap); :mod:`~autograder.sandbox.cgroups` creates, measures
and kills kernel cgroups from outside; :mod:`~autograder.sandbox.limits` is the typed record
of what the launcher enforces (:class:`~autograder.sandbox.limits.SandboxLimits`). Nothing here imports anything but the standard
library (a test keeps it so): the launcher runs before the kernel, on every kernel start.
"""
