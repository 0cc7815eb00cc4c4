"""``python -m autograder serve``: grade each submission as it arrives, and hand its feedback back.

* :mod:`~autograder.service.journal`: the queue on disk (restart-safe) and its fairness rule;
* :mod:`~autograder.service.attempts`: an attempt's files under ``--state``;
* :mod:`~autograder.service.exchange`: nbgrader's filesystem exchange (in: ``inbound/``;
  out: the feedback ``nbgrader fetch_feedback`` reads);
* :mod:`~autograder.service.engine`: the grading loop, on ``grade``'s workers and recording;
* :mod:`~autograder.service.web`: the web page and JSON API under JupyterHub's OAuth;
* :mod:`~autograder.service.serve`: the command itself, which starts both.

:func:`autograder.service.serve.serve` runs the loop in this process and, under JupyterHub (or with ``--port``), the
web page in a child process that dies with it; the two share only the journal.
"""
