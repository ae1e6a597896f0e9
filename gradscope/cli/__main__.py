"""``python -m gradscope.cli``, as ``python -m gradscope``."""

from gradscope.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
