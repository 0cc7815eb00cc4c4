"""What more than one of the grader's processes loads: the instructor's (``host``), the grading
workers' (``worker``, with the ``judge``), ``serve``'s web page and nbgrader's own commands
through the course's ``nbgrader_config.py``; never the sandbox launcher or the kernel.

* ``course_files``: every folder and file name of a course, and ``times``: reading times and
  writing nbgrader's ``timestamp.txt``;
* ``grading_run``: what a run hands its workers (``Settings``, ``RunPayload``) and how the
  host names worker code it starts (it never imports ``worker/``);
* ``submission_folder``: a submission folder read without following anything out of it;
  ``notebook_file``: a notebook's bytes read within caps; ``solution_cells``: which notebook
  belongs to an assignment;
* ``feedback_page``: the one way a feedback page is rendered and rewritten;
* ``similarity``: code fingerprints (the worker's audit, the host's class-wide flags);
* ``limits``: :class:`~autograder.core.limits.Limits`, the one source of every default;
* ``results``: typed records that cross process boundaries (a worker's result, its scores);
* ``assignments``: which assignments a course has; the repository's registry;
* ``cells``: what a cell of an nbgrader notebook is, one vocabulary on :mod:`nbgrader.utils`;
* ``nbgrader_config``: nbgrader's settings for this course, built in code;
* ``gradebook``: nbgrader's gradebook (SQLite or PostgreSQL): the class gradebook in the host,
  a scratch gradebook in each worker;
* ``policy``: due dates and late policies (``course.toml``);
* ``sanitize``, ``formgrader_policy``: what a submission shows renders inert;
* ``untrusted``: student-controlled text made inert for a CSV cell or the terminal.

Code here imports nothing of ``host``, ``worker``, ``judge`` or ``service``.
"""
