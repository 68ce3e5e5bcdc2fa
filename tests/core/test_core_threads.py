"""The threaded kernels leave the caller's torch thread count alone."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import numpy as np, torch
torch.set_num_threads(1)
torch.get_num_threads()  # torch's OpenMP pool in use
from speculate.verify import verify_block, verify_token
p, q = np.full((2, 3, 4), 0.25), np.full((2, 2, 4), 0.25)
args = (p, q, np.zeros((2, 2), np.int64), None, np.full((2, 2), 0.5), np.full(2, 0.5))
verify_token(*args, parallel=True)
verify_block(*args, parallel=True)
print(torch.get_num_threads())
"""


def test_a_threaded_kernel_keeps_torch_at_the_callers_thread_count():
    """Starting Numba's OpenMP layer (the first threaded kernel) reset torch's count from 1 to the
    machine's; in a fresh process, as a user's program runs, it stays at 1."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1"]
