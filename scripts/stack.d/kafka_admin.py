"""Admin helper for scripts/stack (runs in the stack's venv, uses confluent-kafka's AdminClient).

  kafka_admin.py wait  --bootstrap HOST:PORT --deadline SECONDS
      exit 0 once a metadata request on the PLAINTEXT listener names broker 1.
  kafka_admin.py acls  --bootstrap HOST:PORT --admin USER --password PW --limited USER --prefix PREFIX
      (idempotently) grant the limited user READ/DESCRIBE/WRITE on topics PREFIX* and READ on groups PREFIX*,
      logging in as the SCRAM-SHA-512 admin over SASL_PLAINTEXT, then print that user's ACLs.

Uses the Admin API instead of the kafka-acls CLI, whose class moved between 3.9 and 4.0.
"""
import argparse
import logging
import sys
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

quiet = logging.getLogger("librdkafka")
quiet.addHandler(logging.NullHandler())
quiet.propagate = False


def cmd_wait(a):
    deadline = time.monotonic() + a.deadline
    last = None
    while time.monotonic() < deadline:
        admin = AdminClient({"bootstrap.servers": a.bootstrap, "logger": quiet, "socket.timeout.ms": 3000})
        try:
            md = admin.list_topics(timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if 1 in md.brokers:
                print(f"metadata ok: brokers={sorted(md.brokers)} topics={len(md.topics)}")
                return 0
            last = f"metadata without broker 1: {md.brokers}"
        except KafkaException as e:
            last = str(e)
        time.sleep(0.5)
    print(f"broker not ready after {a.deadline}s: {last}", file=sys.stderr)
    return 1


def cmd_acls(a):
    conf = {
        "bootstrap.servers": a.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": a.admin,
        "sasl.password": a.password,
        "logger": quiet,
    }
    admin = AdminClient(conf)
    principal = f"User:{a.limited}"
    wanted = [
        AclBinding(ResourceType.TOPIC, a.prefix, ResourcePatternType.PREFIXED, principal, "*", op, AclPermissionType.ALLOW)
        for op in (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.WRITE)
    ] + [
        AclBinding(ResourceType.GROUP, a.prefix, ResourcePatternType.PREFIXED, principal, "*", AclOperation.READ, AclPermissionType.ALLOW)
    ]
    for binding, fut in admin.create_acls(wanted, request_timeout=30).items():
        fut.result(timeout=60)
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY, AclPermissionType.ANY)
    # ACL propagation through the metadata log is asynchronous: wait until all are visible.
    deadline = time.monotonic() + 30
    while True:
        got = admin.describe_acls(flt, request_timeout=30).result(timeout=60)
        if all(w in got for w in wanted) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    for b in sorted(got, key=str):
        print(f"  acl: {b.principal} {b.permission_type.name} {b.operation.name} "
              f"{b.restype.name}:{b.resource_pattern_type.name}:{b.name}")
    missing = [w for w in wanted if w not in got]
    if missing:
        print(f"ACLs missing after create: {missing}", file=sys.stderr)
        return 1
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait")
    w.add_argument("--bootstrap", required=True)
    w.add_argument("--deadline", type=float, default=60)
    c = sub.add_parser("acls")
    c.add_argument("--bootstrap", required=True)
    c.add_argument("--admin", required=True)
    c.add_argument("--password", required=True)
    c.add_argument("--limited", required=True)
    c.add_argument("--prefix", required=True)
    a = p.parse_args()
    return {"wait": cmd_wait, "acls": cmd_acls}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
