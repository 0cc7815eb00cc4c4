"""nbgrader's filesystem exchange, as the service reads and writes it.

* In: ``nbgrader submit`` (or the Assignments tab's Submit) copies the student's folder to
  ``<exchange>/<course_id>/inbound/<student>+<assignment>+<timestamp>+<random>``
  (:meth:`Exchange.new_submissions`: one ``scandir`` of ``inbound/`` per look; a folder is
  taken once, by its name, once ``submit`` has finished writing it: :func:`landed`).
* Out: nbgrader's ``ExchangeReleaseFeedback`` layout,
  ``<exchange>/<course_id>/feedback/<md5(secret + notebook id)>.html``, the secret being the
  submission's ``submission_secret.txt``; ``nbgrader fetch_feedback`` finds a page there by
  the secrets of the student's own submissions (:func:`release`).

Who handed a folder in is its name's first part, as for nbgrader's ``collect``: the exchange
proves nothing more (see the threat model in ``autograder/README.md``).
"""

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from nbgrader.utils import notebook_hash

from ..core.course_files import SECRET


SECRET_TEXT = re.compile(r"[0-9a-f]{128}")  # nbgrader's secrets.token_hex(64)
SETTLED_SECONDS = 5.0


def landed(folder, now=None):
    """Whether ``nbgrader submit`` has finished writing ``folder``: it copies the files in
    place, then writes ``timestamp.txt``, then ``submission_secret.txt``; a whole secret is
    the last thing written. A folder without one (another writer) counts once nothing in it
    has changed for :data:`SETTLED_SECONDS`."""
    try:
        secret = (folder / SECRET).read_bytes()[:200].decode("ascii", "replace")
    except OSError:
        secret = ""
    if SECRET_TEXT.fullmatch(secret.strip()):
        return True
    try:
        with os.scandir(folder) as entries:
            newest = max([folder.lstat().st_mtime] + [e.stat(follow_symlinks=False).st_mtime
                                                      for e in entries])
    except OSError:
        return False
    return (now or time.time()) - newest >= SETTLED_SECONDS


@dataclass(frozen=True)
class Inbound:
    """One folder of ``inbound/``: its name, and what the name says."""

    name: str
    student: str
    assignment: str
    path: Path


class Exchange:
    """The exchange at ``root`` for course ``course_id``."""

    def __init__(self, root, course_id):
        self.course = Path(root) / course_id
        self.inbound = self.course / "inbound"
        self.feedback = self.course / "feedback"

    def new_submissions(self, known):
        """Folders of ``inbound/`` whose names are not in ``known``, oldest first (by the
        time in the name; then by name)."""
        try:
            with os.scandir(self.inbound) as entries:
                names = [e.name for e in entries if e.name not in known]
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            parts = name.rsplit("+", 3)  # nbgrader's own split: user names may hold '+'
            if len(parts) == 4 and landed(self.inbound / name):
                found.append(Inbound(name, parts[0], parts[1], self.inbound / name))
        return sorted(found, key=lambda f: (f.name.rsplit("+", 3)[2], f.name))

    def release(self, secret, pages):
        """Hand ``{notebook id: html bytes}`` to the student whose submission's secret is
        ``secret``, each page replaced at once (written beside, then renamed)."""
        self.feedback.mkdir(parents=True, exist_ok=True)
        for notebook_id, data in pages.items():
            name = notebook_hash(secret=secret, notebook_id=notebook_id)
            tmp = self.feedback / f"{name}-tmp.html"
            tmp.write_bytes(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.feedback / f"{name}.html")
