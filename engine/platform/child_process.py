"""Child processes that do not outlive the process that started them.

On Linux the kernel SIGKILLs the child when its parent dies, however it dies (SIGKILL included):
`prctl(PR_SET_PDEATHSIG)`, set by a few lines of Python that then exec the real command. The setting
is made in the child's own interpreter rather than in a `preexec_fn`, which is unsafe in a process
with threads (the app downloads on one). The kernel ties the child to the *thread* that started it,
so start and wait for it on one thread. Elsewhere the caller must stop the child on every way out
(try/finally); a parent killed outright leaves it running there.

Either way the child gets a session of its own: a Ctrl+C in the terminal reaches only the parent,
which stops the child itself and only then cleans up after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

_DIE_WITH_PARENT = """\
import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
if os.getppid() != int(sys.argv[1]):  # the parent died before the setting took effect
    sys.exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def popen_tied(cmd: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **popen_kwargs)` for a child that must not outlive this process."""
    if sys.platform.startswith("linux"):
        cmd = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *cmd]
    return subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
