"""The `tandem` console script: the command line needs the `service` extra; without it, say what to install."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from tandem.cli import main as cli_main
    except ModuleNotFoundError as exc:  # the server's distribution without its extra: advice, not a traceback
        sys.exit(f"tandem: the command line needs the service extra (pip install 'tandem[service]'); the HTTP "
                 f"client alone is pip install tandem-client: {exc}")
    cli_main()
