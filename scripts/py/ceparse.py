#!/usr/bin/env python3
"""A CloudEvents consumer for tests: parses HTTP requests with the CloudEvents Python SDK's
HTTP binding (binary or structured mode, detected as the SDK does).

Reads one JSON document on stdin:
{"requests": [{"headers": {"ce-id": "...", "content-type": "..."}, "body_b64": "..."}]}

Prints {"events": [{"attributes": {...}, "data": ..., "data_b64": "..."}]}, one per request in
order: the event's attributes as the SDK read them (time as RFC 3339 text), its data as JSON
when the SDK decoded it to a JSON value, and the data bytes in base64 otherwise. A request the
SDK refuses makes the script fail with the SDK's error.
"""
import base64
import datetime
import json
import sys

from cloudevents.core.bindings.http import HTTPMessage, from_http_event


def attribute(v):
    if isinstance(v, datetime.datetime):
        return v.isoformat()
    return v


def main():
    spec = json.load(sys.stdin)
    events = []
    for i, r in enumerate(spec["requests"]):
        message = HTTPMessage(headers=r["headers"], body=base64.b64decode(r["body_b64"]))
        try:
            event = from_http_event(message)
        except Exception as e:  # the SDK's own refusal, with the request it refused
            sys.exit(f"request {i} is not a CloudEvent: {e!r}: {r}")
        data = event.get_data()
        out = {"attributes": {k: attribute(v) for k, v in event.get_attributes().items()}}
        if isinstance(data, (bytes, bytearray)):
            out["data_b64"] = base64.b64encode(bytes(data)).decode()
        else:
            out["data"] = data
        events.append(out)
    json.dump({"events": events}, sys.stdout)


if __name__ == "__main__":
    main()
