# SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
"""Tests of the fabep package against the library of a build tree
(FABEP_LIBRARY) or the installed one."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
# the package of this source tree, unless the caller points elsewhere
if "FABEP_PY_NO_SRC" not in os.environ:
    sys.path.insert(0, os.path.dirname(here))
os.environ.setdefault("FI_SOCKETS_PE_WAITTIME", "0")
os.environ.setdefault("FABEP_PROVIDER", "shm")
