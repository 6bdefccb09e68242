"""Settings that every test of the suite shares.

The suite compiles every kernel in the process that first needs it
(``SERA_OPT_BACKGROUND_COMPILE=0``): a test that checks which kernel solved a problem,
or the work it reports, must not depend on whether a background compile has finished.
tests/test_background_compile.py runs the default, a kernel compiled in a background
process, in fresh processes of its own.
"""

from __future__ import annotations

import os

os.environ.setdefault("SERA_OPT_BACKGROUND_COMPILE", "0")
