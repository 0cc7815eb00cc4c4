"""What a measuring kernel imports before its memory window opens: only installed modules.

:func:`autograder.judge.execute.imported_modules` names the modules a student's cells import;
:data:`autograder.judge.execute.WARM_IMPORTS` imports each only where it resolves to the
interpreter's standard library or site-packages. Run here in a fresh interpreter whose
``sys.path`` starts with a folder the "student" wrote modules into: a module of theirs
(also one that shadows a standard-library name) never runs before the window.
"""

import subprocess
import sys

from autograder.judge.execute import WARM_IMPORTS, imported_modules


def test_the_names_of_every_import_statement_are_found():
    cells = ["import numpy as np, math\n%timeit np.ones(3)\n!ls\nfrom torch.nn import functional as F",
             "def f():\n    import json\n    from . import sibling\n    return json",
             "x = (  # does not parse: names nothing", ""]
    assert imported_modules(cells) == ["json", "math", "numpy", "torch.nn"]


def test_only_modules_of_the_installation_are_imported(tmp_path):
    ran = tmp_path / "ran"
    for name in ("ballast", "colorsys"):  # one new name, one that shadows the standard library
        (tmp_path / f"{name}.py").write_text(f"open({str(ran / name)!r}, 'w').close()\n")
    ran.mkdir()
    names = ["ballast", "colorsys", "wave", "json.decoder", "no_such_module.sub"]
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            + WARM_IMPORTS.format(names=names)
            + "print(sorted(n for n in ('ballast', 'colorsys', 'wave', 'json.decoder', '_warm')"
              " if n in sys.modules or n in globals()))\n")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert out.strip() == "['json.decoder', 'wave']"  # installed ones only; the helper is gone
    assert list(ran.iterdir()) == []  # no module of the student's ran
