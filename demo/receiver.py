"""Run the demo remote receiver (a small CRM, demo/crm.py) on 127.0.0.1:PORT until interrupted:
`python -m demo.receiver --port 8900`. `scripts/run.py` (`make run`) starts it as its `receiver` child.

The CRM keeps its records, id sequence and answered Idempotency-Keys in a journal file, so a restart (a second
`make run` on the same database) continues where it stopped, as a real receiver would (D-440): `--journal PATH`,
else the environment's DEMO_RECEIVER_JOURNAL, else `.data/demo-crm.jsonl` of the checkout; `--journal ''` keeps
everything in memory only. Remove the file (or `.data/` with the private servers) to start the CRM empty."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from demo.crm import DemoCrm

DEFAULT_JOURNAL = Path(__file__).resolve().parent.parent / ".data" / "demo-crm.jsonl"


def journal_path(argument: str | None, environ: dict[str, str]) -> Path | None:
    """The journal the CRM keeps: the argument, else DEMO_RECEIVER_JOURNAL, else DEFAULT_JOURNAL; '' is none."""
    value = argument if argument is not None else environ.get("DEMO_RECEIVER_JOURNAL", str(DEFAULT_JOURNAL))
    return Path(value) if value else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.receiver", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--journal", default=None,
                        help="the CRM's journal file (default: $DEMO_RECEIVER_JOURNAL or .data/demo-crm.jsonl; "
                             "'' keeps the CRM in memory only)")
    args = parser.parse_args(argv)

    def write(line: str) -> None:
        print(line, file=sys.stdout, flush=True)

    journal = journal_path(args.journal, dict(os.environ))
    server = DemoCrm(write=write, journal=journal).server(args.port)
    write(f"demo receiver listening on http://127.0.0.1:{args.port} (journal: {journal or 'none, in memory'})")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
