"""nbgrader settings for instructors who run ``nbgrader`` or its formgrader directly
from the repository root (``python -m autograder`` applies the same settings itself).

They are the course settings of ``autograder/core/nbgrader_config.py``: sources in
``solutions/``, student versions in ``release/``, gradebook ``gradebook.db``,
feedback without hidden tests, and the same autograding as the driver: every
kernel in the OS sandbox, every test cell scored by the outside judge, the default
limits of ``autograder/core/limits.py``. ``nbgrader autograde`` and the formgrader's
Autograde button therefore give the scores ``python -m autograder grade`` gives. What a
submission holds renders inert in the formgrader's submission views and in
``nbgrader generate_feedback``'s pages (``autograder/core/sanitize.py``): no student markup,
output or metadata runs a script or loads anything there. Loaded inside a Jupyter server (the
formgrader), it also gives the formgrader's submission view a Content-Security-Policy
(``autograder/core/formgrader_policy.py``).
"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from autograder.core.nbgrader_config import autograde_settings, course_config, prepare_nbgrader  # noqa: E402

prepare_nbgrader()  # gradebooks are created without the `alembic` command on PATH
c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.merge(course_config(ROOT))
c.merge(autograde_settings())
if "jupyter_server.serverapp" in sys.modules:  # the formgrader, in the instructor's Jupyter server
    from nbgrader.server_extensions.formgrader.handlers import SubmissionHandler

    from autograder.core.formgrader_policy import protect

    protect(SubmissionHandler)
