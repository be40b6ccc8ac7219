#!/usr/bin/env python3
"""Producer for scripts/bench: Avro records in the Confluent wire format, written with
confluent-kafka's AvroSerializer (the reference implementation), keyed "k0".."k<keys-1>".

Reads one JSON document on stdin:
{
  "mode": "backlog" | "paced",
  "bootstrap": "127.0.0.1:19092", "registry": "http://.../apis/ccompat/v7", "topic": "t",
  "keys": 1000,
  "count": 200000,          backlog: how many records (record i has key k<i % keys>)
  "rate": 3000, "seconds": 20,   paced: records per second for this long
  "pool": 4096              paced: distinct values serialized up front (the serializer would
                            otherwise cost more CPU than the connector at high rates)
}
The schema has 6 fields and a record is about 80 bytes framed. A backlog is written with
linger 50 ms (fast), paced traffic with linger 1 ms (its timestamp is the produce call, and
the bench measures timestamp -> dispatcher). Prints {"produced": n, "seconds": s, "rate": r}.
"""
import json
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

SCHEMA = json.dumps({
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [
        {"name": "seq", "type": "long"},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "status", "type": {"type": "enum", "name": "Status",
                                    "symbols": ["NEW", "PAID", "SHIPPED", "CANCELLED"]}},
        {"name": "note", "type": "string"},
    ],
})
STATUSES = ["NEW", "PAID", "SHIPPED", "CANCELLED"]
BASE_MS = 1_780_000_000_000


def record(i, keys):
    return {
        "seq": i,
        "created_at": BASE_MS + i,
        "customer": f"customer-{i % keys:06d}@example.com",
        "amount": (i % 100_000) / 100.0,
        "status": STATUSES[i % 4],
        "note": f"bench order {i:09d} of the load run",
    }


def produce(producer, topic, key, value):
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            producer.poll(0.01)


def main():
    spec = json.load(sys.stdin)
    topic, keys = spec["topic"], int(spec.get("keys", 1000))
    sr = SchemaRegistryClient({"url": spec["registry"], "timeout": 20})
    ser = AvroSerializer(sr, SCHEMA, conf={"subject.name.strategy": topic_subject_name_strategy,
                                           "auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    common = {"bootstrap.servers": spec["bootstrap"], "enable.idempotence": True, "acks": "all"}
    started = time.monotonic()
    n = 0
    if spec["mode"] == "backlog":
        p = Producer({**common, "linger.ms": 50, "batch.size": 1_000_000})
        for i in range(int(spec["count"])):
            produce(p, topic, f"k{i % keys}".encode(), ser(record(i, keys), ctx))
            if i % 5000 == 0:
                p.poll(0)
        n = int(spec["count"])
    elif spec["mode"] == "paced":
        p = Producer({**common, "linger.ms": 1})
        pool = [ser(record(i, keys), ctx) for i in range(int(spec.get("pool", 4096)))]
        rate, seconds = float(spec["rate"]), float(spec["seconds"])
        begin = time.monotonic()
        end = begin + seconds
        while True:
            now = time.monotonic()
            if now >= end:
                break
            # Catch up with the schedule, then wait for the next 2 ms tick: bursts of at most
            # rate/500 records, so the pacing itself adds at most ~2 ms to a record's latency.
            due = int((now - begin) * rate)
            while n < due:
                produce(p, topic, f"k{n % keys}".encode(), pool[n % len(pool)])
                n += 1
            p.poll(0)
            time.sleep(max(0.0, 0.002 - (time.monotonic() - now)))
    else:
        raise SystemExit(f"unknown mode {spec['mode']}")
    remaining = p.flush(120)
    if remaining:
        raise SystemExit(f"{remaining} records not delivered")
    seconds = time.monotonic() - started
    json.dump({"produced": n, "seconds": round(seconds, 3), "rate": round(n / seconds, 1),
               "value_bytes": len(ser(record(n, keys), ctx))}, sys.stdout)


if __name__ == "__main__":
    main()
