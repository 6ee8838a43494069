"""The `tandem` console script: the command line needs the `service` extra, the base install is the client."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from tandem.cli import main as cli_main
    except ModuleNotFoundError as exc:  # a client-only install: say what to install instead of a traceback
        sys.exit(f"tandem: the command line needs the service extra (pip install 'tandem[service]'): {exc}")
    cli_main()
