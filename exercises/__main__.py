"""``python -m exercises [NAME ...] [--solutions]``: check exercises; exit status 1 if any fails."""
import sys

from exercises import NAMES, check

args = [a for a in sys.argv[1:] if a != "--solutions"]
ok = [check(n, solution="--solutions" in sys.argv) for n in (args or NAMES)]
sys.exit(0 if all(ok) else 1)
