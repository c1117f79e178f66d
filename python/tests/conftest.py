import os
import sys

# Run from the source tree: `PYTHONPATH=python pytest python/tests` or plain pytest (this adds it).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
