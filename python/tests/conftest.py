# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Tests of the fabep package against the library of a build tree
(FABEP_LIBRARY) or the installed one."""
import os
import signal
import sys

import pytest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
# the package of this source tree, unless the caller points elsewhere
if "FABEP_PY_NO_SRC" not in os.environ:
    sys.path.insert(0, os.path.dirname(here))
os.environ.setdefault("FI_SOCKETS_PE_WAITTIME", "0")
os.environ.setdefault("FABEP_PROVIDER", "shm")


@pytest.fixture
def sigint_default():
    """The children of the test start with SIGINT's default action.  A
    suite started in the background of a shell, or under nohup, runs
    with SIGINT (and SIGHUP) ignored, and an ignored signal stays ignored
    across fork and exec: Python then installs no KeyboardInterrupt
    handler, and fabep.run rightly leaves such a signal ignored.  A
    handler here (not SIG_IGN) becomes the default action in a child."""
    old = signal.getsignal(signal.SIGINT)
    if old == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
