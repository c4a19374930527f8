"""``python -m steptp.cli``: the ``stp`` command line."""

from . import main

main()
