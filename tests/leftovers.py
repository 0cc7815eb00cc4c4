"""What a grading run may leave on the machine: its kernel cgroups and scratch folders.

Not a test module. Everything a run makes outside the course is named after the run's id
(``autograder.host.driver.run_id``): its scratch folder ``autograder-<run>`` and its workers'
``autograder-<run>-*`` (under ``tempfile.gettempdir()``), its kernels' socket folder
``/tmp/autograder-<run>-sockets-*`` and its kernel cgroups ``k<run>-*``. Each stamp the run
writes (``autograded/<student>/<id>/.autograder.json``) holds that id. So a test finds one
run's leftovers by name, whatever the runs of other tests beside it leave meanwhile.
"""

import json
import tempfile
from pathlib import Path

from autograder.sandbox.cgroups import kernel_cgroups
from autograder.core.grading_run import SOCKET_BASE


def run_ids(root, assignment):
    """The ids of the runs whose stamps are in course ``root`` for ``assignment``."""
    return {json.loads(stamp.read_text())["run"]
            for stamp in Path(root).glob(f"autograded/*/{assignment}/.autograder.json")}


def scratch_folders(runs):
    """The kernel cgroups and scratch folders of the runs ``runs`` that exist now."""
    assert runs, "no run to look for (no stamp was written?)"
    found = set()
    for base in {Path(tempfile.gettempdir()), Path(SOCKET_BASE)}:
        for run in runs:
            found |= {str(p) for pattern in (f"autograder-{run}", f"autograder-{run}-*")
                      for p in base.glob(pattern)}
    prefixes = tuple(f"k{run}-" for run in runs)
    return found | {f"cgroup {name}" for name in kernel_cgroups() if name.startswith(prefixes)}
