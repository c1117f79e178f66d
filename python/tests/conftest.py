import os
import sys

# Run from the source tree: `PYTHONPATH=python pytest python/tests` or plain pytest (this adds it).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# The tests check the measured default kernels; autotuning has its own test (test_torch.py,
# FAJIT_AUTOTUNE=1 around one compile). A value the caller set wins.
os.environ.setdefault("FAJIT_AUTOTUNE", "0")
