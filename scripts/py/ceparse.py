#!/usr/bin/env python3
"""A CloudEvents consumer for tests: parses HTTP requests with the CloudEvents Python SDK's
HTTP binding (binary or structured mode, detected as the SDK does).

Reads one JSON document on stdin:
{"requests": [{"headers": {"ce-id": "...", "content-type": "..."}, "body_b64": "..."}]}

Prints {"events": [{"request": i, "attributes": {...}, "data": ..., "data_b64": "..."}]}, one
per request in order, or, for a structured batch (`application/cloudevents-batch+json`, which
the SDK has no HTTP reader for), one per member of its JSON array, each read with the SDK's
JSON event format: the event's attributes as the SDK read them (time as RFC 3339 text), its data as JSON
when the SDK decoded it to a JSON value, and the data bytes in base64 otherwise. A request the
SDK refuses makes the script fail with the SDK's error.
"""
import base64
import datetime
import json
import sys

from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from cloudevents.core.formats.json import JSONFormat

BATCH = "application/cloudevents-batch+json"


def attribute(v):
    if isinstance(v, datetime.datetime):
        return v.isoformat()
    return v


def main():
    spec = json.load(sys.stdin)
    events = []
    for i, r in enumerate(spec["requests"]):
        body = base64.b64decode(r["body_b64"])
        content_type = {k.lower(): v for k, v in r["headers"].items()}.get("content-type", "")
        try:
            if content_type.split(";")[0].strip() == BATCH:
                members = json.loads(body)
                if not isinstance(members, list):
                    raise ValueError("a batch is not a JSON array")
                parsed = [JSONFormat().read(None, json.dumps(m)) for m in members]
            else:
                parsed = [from_http_event(HTTPMessage(headers=r["headers"], body=body))]
        except Exception as e:  # the SDK's own refusal, with the request it refused
            sys.exit(f"request {i} is not a CloudEvent: {e!r}: {r}")
        for event in parsed:
            data = event.get_data()
            out = {
                "request": i,
                "attributes": {k: attribute(v) for k, v in event.get_attributes().items()},
            }
            if isinstance(data, (bytes, bytearray)):
                out["data_b64"] = base64.b64encode(bytes(data)).decode()
            else:
                out["data"] = data
            events.append(out)
    json.dump({"events": events}, sys.stdout)


if __name__ == "__main__":
    main()
