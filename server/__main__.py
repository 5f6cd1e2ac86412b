"""``python -m server --upstream URL [--upstream URL ...] --port P [--api-key K]``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from server.config import config_from_args
from server.errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = config_from_args(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from server.serve import run

    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
