"""Processes compiling one function into one Numba cache at once leave every signature its own machine code.

Without the lock (kernels/common/cache_lock.py) this failed in most rounds: two processes gave two signatures
the same data file, and a later run loaded one signature's code for the other (wrong sums, "can't unbox
array", or a crash).
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, ROUNDS = 4, 2

FUNCTION = """
from numba import njit

@njit(cache=True)
def doubled_sum(x, k):
    s = x.ravel()[0] * 0
    for v in x.ravel():
        s += v * 2
    return s + k * 0
"""

# every process builds the same list of (array, scalar) argument pairs: 8 dtypes x 5 scalar types x 2 ranks
CALLS = """
import sys, time
import numpy as np
import kernels.cpu  # installs the cache lock, as every Fucina process does
sys.path.insert(0, sys.argv[1])
import summed

DTYPES = [np.int64, np.float32, np.float64, np.int32, np.int16, np.uint8, np.uint16, np.uint32]
SCALARS = [1, 1.0, True, np.int8(1), 1j]
CALLS = [(np.arange(4, dtype=d).reshape(shape), k) for d in DTYPES for k in SCALARS for shape in ((4,), (2, 2))]
"""

COMPILE = CALLS + """
share, start = int(sys.argv[2]), float(sys.argv[3])
while time.time() < start:  # all processes compile at once
    pass
for x, k in CALLS[share::%d]:
    summed.doubled_sum(x, k)
""" % PROCESSES

CHECK = CALLS + """
wrong = sum(summed.doubled_sum(x, k) != 12 for x, k in CALLS)
hits = sum(summed.doubled_sum.stats.cache_hits.values())
print(wrong, hits, len(CALLS))
"""


def _python(code: str, *args, cache: Path) -> subprocess.Popen:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_processes_compiling_side_by_side_leave_each_signature_its_own_code(tmp_path):
    (tmp_path / "summed.py").write_text(textwrap.dedent(FUNCTION))
    for round_ in range(ROUNDS):
        cache = tmp_path / f"cache{round_}"
        start = time.time() + 2  # after every process has imported numba
        compiling = [_python(COMPILE, tmp_path, share, start, cache=cache) for share in range(PROCESSES)]
        for process in compiling:
            _, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-2000:]
        out, err = _python(CHECK, tmp_path, cache=cache).communicate(timeout=300)
        assert out.split(), err[-2000:]  # a signature loaded another's code and failed to run
        wrong, hits, calls = map(int, out.split())
        assert (wrong, hits) == (0, calls), f"round {round_}: {wrong} wrong sums, {hits} of {calls} from the cache"
