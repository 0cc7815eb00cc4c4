"""Shared by every trusted process of the grader: the instructor's (``host``), the workers'
(``worker``) and the judge's (``judge``); never by the sandbox launcher or the kernel.

* ``limits``: :class:`~autograder.core.limits.Limits`, the one source of every default;
* ``results``: typed records that cross process boundaries (a worker's result, its scores);
* ``assignments``: the course's assignments, one registry;
* ``cells``: what a cell of an nbgrader notebook is, one vocabulary on :mod:`nbgrader.utils`;
* ``nbgrader_config``: nbgrader's settings for this course, built in code;
* ``gradebook``: nbgrader's gradebook (SQLite or PostgreSQL): the class gradebook in the host,
  a scratch gradebook in each worker;
* ``policy``: due dates and late policies (``course.toml``);
* ``untrusted``: student-controlled text made inert for a CSV cell or the terminal.

Code here imports nothing of ``host``, ``worker`` or ``judge``.
"""
