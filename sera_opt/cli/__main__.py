"""``python -m sera_opt.cli``: the ``sera-opt`` command."""

import sys

from .parser import main

sys.exit(main())
