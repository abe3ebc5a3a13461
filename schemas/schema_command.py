"""``ccld schema [verdict|metrics|record|deadletter|report]``: the Avro schema of a record on the wire, as JSON.

For those who read the topics with their own tools: the schema files in ``schemas/`` are the one source of
truth, and this prints the one a topic's messages are written with (docs/wire-format.md tells the framing:
Avro single-object encoding, a two-byte marker and the schema's 8-byte fingerprint before the body). With
``verdicts_encoding=json`` the verdicts topic carries JSON objects instead, with the same fields.
"""

from __future__ import annotations

import argparse
import json

from ccld.schemas.codec import load_schema
from ccld.settings import Settings

#: what a user asks for -> the schema file's record name
NAMES = {"verdict": "Verdict", "metrics": "KernelBatch", "record": "KernelRecord", "deadletter": "DeadLetter",
         "report": "ShardReport"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument("name", choices=sorted(NAMES), help="verdict (the verdicts topic), metrics (the metrics "
                        "topic's batches), record (one kernel record), deadletter, report (a split job's shard report)")


def main(args: argparse.Namespace, settings: Settings) -> int:
    print(json.dumps(dict(load_schema(NAMES[args.name]).raw), indent=2))
    return 0
