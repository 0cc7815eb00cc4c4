"""``python -m autograder``: the instructor's command line (:mod:`autograder.host.cli`)."""

from .host.cli import main

main()
