"""``python -m tilecraft ...``: the same as the ``tilecraft`` command."""
import sys

from .cli import main

sys.exit(main())
