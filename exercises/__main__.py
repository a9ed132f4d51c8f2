"""``python -m exercises [NAME ...] [--solutions]``: check exercises; exit status 1 if any fails."""
import sys

from exercises import NAMES, check


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--solutions"]
    ok = [check(n, solution="--solutions" in sys.argv) for n in (args or NAMES)]
    return 0 if all(ok) else 1


if __name__ == "__main__":  # the guard: chapter 4's check starts rank processes that import this module
    sys.exit(main())
