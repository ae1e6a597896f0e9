"""``python -m gradscope``: the same entry point as the ``gradscope`` command."""

from gradscope.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
