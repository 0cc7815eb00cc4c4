"""nbgrader settings for instructors who run ``nbgrader`` or its formgrader directly
from the repository root (``python -m autograder`` does not need this file).

They are the course settings of ``autograder/nbgrader_config.py``: sources in
``solutions/``, student versions in ``release/``, gradebook ``gradebook.db``,
feedback without hidden tests.
"""

import os
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from autograder.nbgrader_config import course_config  # noqa: E402

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.merge(course_config(ROOT))
