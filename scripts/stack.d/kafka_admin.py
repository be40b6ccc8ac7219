"""Admin helper for scripts/stack (runs in the stack's venv, uses confluent-kafka's AdminClient).

  kafka_admin.py wait  --bootstrap HOST:PORT --deadline SECONDS
      exit 0 once a metadata request on the PLAINTEXT listener names broker 1.
  kafka_admin.py acls  --bootstrap HOST:PORT --admin USER --password PW --limited USER --prefix PREFIX
      (idempotently) grant the limited user READ/DESCRIBE/WRITE on topics PREFIX* and READ on groups PREFIX*,
      logging in as the SCRAM-SHA-512 admin over SASL_PLAINTEXT, then print that user's ACLs.

  kafka_admin.py scram-user --bootstrap HOST:PORT --admin USER --password PW --user NAME --user-password-env VAR
      create (or update) a SCRAM-SHA-512 user whose password is read from the environment variable VAR
      (kept off the command line), and wait until the broker knows it.
  kafka_admin.py acl --bootstrap HOST:PORT --admin USER --password PW --principal NAME (--add|--remove) SPEC...
      add or remove LITERAL ALLOW ACLs for User:NAME, SPEC = topic:NAME:OP | group:NAME:OP | cluster:kafka-cluster:OP,
      and wait until the change is visible.

Uses the Admin API instead of the kafka-acls CLI, whose class moved between 3.9 and 4.0.
"""
import os
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


def admin_client(a):
    return AdminClient({
        "bootstrap.servers": a.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": a.admin,
        "sasl.password": a.password,
        "logger": quiet,
    })


def cmd_scram_user(a):
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    secret = os.environ[a.user_password_env]
    admin = admin_client(a)
    up = UserScramCredentialUpsertion(a.user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), secret.encode())
    for fut in admin.alter_user_scram_credentials([up], request_timeout=30).values():
        fut.result(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            futs = admin.describe_user_scram_credentials([a.user], request_timeout=30)
            desc = futs[a.user].result(timeout=60)
            if desc.scram_credential_infos:
                print(f"scram user {a.user} ready")
                return 0
        except KafkaException:
            pass
        time.sleep(0.3)
    print(f"scram user {a.user} not visible after 30s", file=sys.stderr)
    return 1


def acl_binding(principal, spec):
    kind, _, rest = spec.partition(":")
    name, _, op = rest.rpartition(":")
    restype = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER}[kind]
    return AclBinding(restype, name, ResourcePatternType.LITERAL, f"User:{principal}", "*",
                      getattr(AclOperation, op), AclPermissionType.ALLOW)


def cmd_acl(a):
    admin = admin_client(a)
    bindings = [acl_binding(a.principal, s) for s in a.specs]
    if a.add:
        for fut in admin.create_acls(bindings, request_timeout=30).values():
            fut.result(timeout=60)
    else:
        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                    b.operation, b.permission_type) for b in bindings]
        for fut in admin.delete_acls(filters, request_timeout=30).values():
            fut.result(timeout=60)
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{a.principal}", None,
                           AclOperation.ANY, AclPermissionType.ANY)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = admin.describe_acls(flt, request_timeout=30).result(timeout=60)
        if all((b in got) == a.add for b in bindings):
            print(f"acls of User:{a.principal}: {len(got)}")
            return 0
        time.sleep(0.3)
    print("ACL change not visible after 30s", file=sys.stderr)
    return 1


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
    for name in ("scram-user", "acl"):
        x = sub.add_parser(name)
        x.add_argument("--bootstrap", required=True)
        x.add_argument("--admin", required=True)
        x.add_argument("--password", required=True)
        if name == "scram-user":
            x.add_argument("--user", required=True)
            x.add_argument("--user-password-env", required=True)
        else:
            x.add_argument("--principal", required=True)
            g = x.add_mutually_exclusive_group(required=True)
            g.add_argument("--add", action="store_true")
            g.add_argument("--remove", action="store_true")
            x.add_argument("specs", nargs="+")
    a = p.parse_args()
    return {"wait": cmd_wait, "acls": cmd_acls, "scram-user": cmd_scram_user, "acl": cmd_acl}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
