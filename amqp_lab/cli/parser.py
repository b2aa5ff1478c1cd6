"""The command line's argument parser: argparse, with a refused option as one line.

argparse's own ``error()`` prints the whole usage and then ``prog: error: ...``: on a command
with thirty options the one line that matters is buried under a screen of usage. Every
amqp-lab command and script parses with :class:`CommandParser` instead, which prints
``error: MESSAGE`` (one line, control characters escaped) on stderr and exits
:data:`EXIT_USAGE` (2, as argparse does); ``--help`` still prints the usage and every option.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from amqp_lab.oneline import one_line

__all__ = ["EXIT_USAGE", "CommandParser", "usage_error"]

EXIT_USAGE = 2
"""Exit code of a refused option or argument (argparse's own)."""


def usage_error(message: str) -> NoReturn:
    """Print ``error: MESSAGE`` (one line) on stderr and exit :data:`EXIT_USAGE`."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


class CommandParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line (:func:`usage_error`) instead
    of the usage and a message; its subparsers (``add_subparsers``) are CommandParsers too."""

    def error(self, message: str) -> NoReturn:
        """A refused option, a missing argument, a bad value: one line, exit 2."""
        usage_error(message)
