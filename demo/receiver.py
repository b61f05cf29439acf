"""Run the demo remote receiver (a small CRM, demo/crm.py) on 127.0.0.1:PORT until interrupted:
`python -m demo.receiver --port 8900`. `scripts/run.py` (`make run`) starts it as its `receiver` child."""
from __future__ import annotations

import argparse
import sys

from demo.crm import DemoCrm


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.receiver", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8900)
    args = parser.parse_args(argv)

    def write(line: str) -> None:
        print(line, file=sys.stdout, flush=True)

    server = DemoCrm(write=write).server(args.port)
    write(f"demo receiver listening on http://127.0.0.1:{args.port}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
