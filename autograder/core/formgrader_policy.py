"""A Content-Security-Policy for the formgrader's submission view, where a submission is shown.

nbgrader's formgrader renders each submitted notebook into a page of the instructor's Jupyter
server (``/formgrader/submissions/<id>/``), whose session can read ``solutions/`` through
``/api/contents`` and open a terminal. The notebook's HTML is already sanitized
(:mod:`autograder.core.sanitize`); this policy makes whatever a sanitizer might miss unable to
run there, as the feedback pages' policy does (``autograder.core.feedback_page``):

* scripts only from the server itself (``'self'``: nbgrader's jQuery, Bootstrap, formgrade.js)
  and the page's own inline scripts, each allowed by its SHA-256. Only scripts that stand
  before the notebook (``<div id="notebook-container">``) are hashed: they are nbgrader's
  template; nothing after that point is ever allowed to run. No ``'unsafe-inline'``, so no
  inline event handler and no ``javascript:`` URL runs, except nbgrader's own two handlers
  (``toggle_name(true);`` / ``toggle_name(false);``, by hash with ``'unsafe-hashes'``);
* images from the server and ``data:``; styles from the server and inline (the template's);
  requests only to the server (the formgrader's API); no frame, object, form target or
  ``<base>``. MathJax, which nbgrader loads from a CDN, is not allowed: math in the formgrader
  shows as TeX (the feedback pages render it offline).

:func:`protect` installs it on a handler class, nbgrader's ``SubmissionHandler``: the
course's ``nbgrader_config.py`` does so when it is loaded inside a Jupyter server, so every
formgrader started from the course root gets it (the grader itself holds no server code).
"""

import base64
import hashlib
import re

NOTEBOOK_START = 'id="notebook-container"'
TEMPLATE_HANDLERS = ("toggle_name(true);", "toggle_name(false);")  # nbgrader's own nav bar
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S | re.I)


def _sha256(text):
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def submission_view_policy(page):
    """The policy for the formgrader page ``page`` (HTML text): see the module's docstring."""
    end = page.find(NOTEBOOK_START)
    template = page[:end] if end >= 0 else ""
    hashes = sorted({_sha256(script) for script in _INLINE_SCRIPT.findall(template)}
                    | {_sha256(handler) for handler in TEMPLATE_HANDLERS})
    return ("default-src 'none'; "
            f"script-src 'self' 'unsafe-hashes' {' '.join(hashes)}; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")


def protect(handler_class):
    """Make ``handler_class`` (a tornado handler that writes a submission view) send
    :func:`submission_view_policy` of what it writes; idempotent."""
    if getattr(handler_class, "_course_policy", False):
        return
    write = handler_class.write

    def write_with_policy(self, chunk):
        if isinstance(chunk, (str, bytes)):
            page = chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
            self.set_header("Content-Security-Policy", submission_view_policy(page))
        return write(self, chunk)

    handler_class.write = write_with_policy
    handler_class._course_policy = True
