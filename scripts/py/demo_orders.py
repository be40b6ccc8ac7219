#!/usr/bin/env python3
"""Publishes sample Avro order events for the quick start: creates the topic, registers the
schema through the registry, and writes N orders over a handful of customer keys."""
import argparse
import datetime
import decimal
import random

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

SCHEMA = """{"type":"record","name":"OrderPlaced","namespace":"demo","fields":[
 {"name":"order_id","type":"string"},
 {"name":"customer","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"currency","type":{"type":"enum","name":"Currency","symbols":["EUR","USD","GBP"]}},
 {"name":"placed_at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--registry", required=True)
    ap.add_argument("--topic", default="demo-orders")
    ap.add_argument("--count", type=int, default=20)
    a = ap.parse_args()
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    fs = admin.create_topics([NewTopic(a.topic, num_partitions=3, replication_factor=1)])
    for f in fs.values():
        try:
            f.result()
        except Exception as e:  # already exists on a second run
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    sr = SchemaRegistryClient({"url": a.registry, "timeout": 20})
    ser = AvroSerializer(sr, SCHEMA, conf={"subject.name.strategy": topic_subject_name_strategy})
    p = Producer({"bootstrap.servers": a.bootstrap, "enable.idempotence": True})
    customers = ["ada", "grace", "linus", "barbara", "ken"]
    now = datetime.datetime.now(datetime.timezone.utc)
    for i in range(a.count):
        c = customers[i % len(customers)]
        order = {"order_id": f"o-{i:04d}", "customer": c,
                 "amount": decimal.Decimal(random.randint(100, 99999)) / 100,
                 "currency": random.choice(["EUR", "USD", "GBP"]), "placed_at": now}
        p.produce(a.topic, key=c.encode(), value=ser(order, SerializationContext(a.topic, MessageField.VALUE)))
    p.flush(30)
    print(f"published {a.count} orders to {a.topic}")


if __name__ == "__main__":
    main()
