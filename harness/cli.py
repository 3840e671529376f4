"""``python -m decodebench.cli`` and ``from decodebench.cli import main`` as they worked before the commands moved to
decodebench.commands (scripts and CI jobs outside this repository call them); the CLI itself is commands/cli.py."""

from decodebench.commands.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
