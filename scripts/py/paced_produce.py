#!/usr/bin/env python3
"""Paced transactional producer for the chaos test: steady keyed traffic for as long as the
test runs, with every n-th transaction aborted.

Reads one line of JSON on stdin:
{
  "bootstrap": "127.0.0.1:19092", "topic": "t", "partitions": 12,
  "rate": 300,              records per second, aborted ones included
  "txn_records": 30,        records per transaction
  "abort_every": 7,         every n-th transaction is aborted (the 7th, the 14th, ...)
  "keys": 300,              keys "k0".."k<keys-1>", picked at random (seeded)
  "seed": 1,
  "max_seconds": 600        stop by itself after this long
}
then keeps producing until stdin has another line or reaches end of file (the test is done
or died), or max_seconds pass. Each record is keyed, its value {"i": i} with i counting up
over every record written, aborted ones included. The last transaction is always committed
and writes one record to each partition (keys "tail-<p>"), so every partition ends with
committed records: a consumer's commit can reach the end even when an aborted transaction
came before.

Prints {"committed": [i...], "aborted": [i...], "transactions": n, "aborted_transactions": m,
"failed_commits": f, "seconds": s} once done; a transaction whose commit failed and had to be
aborted counts as aborted (f of the m).
"""
import json
import random
import sys
import threading
import time

from confluent_kafka import KafkaException, Producer


def main():
    spec = json.loads(sys.stdin.readline())
    stop = threading.Event()

    def watch_stdin():
        sys.stdin.readline()  # a line or end of file: either way, stop
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    topic = spec["topic"]
    rate = float(spec.get("rate", 300))
    per_txn = int(spec.get("txn_records", 30))
    abort_every = int(spec.get("abort_every", 7))
    keys = int(spec.get("keys", 300))
    rng = random.Random(spec.get("seed", 1))
    deadline = time.monotonic() + float(spec.get("max_seconds", 600))
    producer = Producer({
        "bootstrap.servers": spec["bootstrap"],
        "transactional.id": f"paced-{topic}",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    })
    producer.init_transactions(30)

    committed, aborted = [], []
    state = {"i": 0, "txns": 0, "aborts": 0, "failed_commits": 0}

    def abort(written):
        # Flush first, so that the aborted records reach the log (a read_committed consumer
        # must skip them) and the abort has nothing to purge: purged messages can leave a gap
        # in the idempotent sequence that fails a later transaction (seen:
        # OUT_OF_ORDER_SEQUENCE_NUMBER on the next commit).
        producer.flush(30)
        producer.abort_transaction(30)
        state["aborts"] += 1
        aborted.extend(written)

    def commit(written):
        while True:
            try:
                producer.commit_transaction(30)
                committed.extend(written)
                return
            except KafkaException as e:
                err = e.args[0]
                if err.retriable():
                    continue
                if err.txn_requires_abort():
                    # Not committed: count its records as aborted, which they are.
                    state["failed_commits"] += 1
                    abort(written)
                    return
                raise

    def transaction(records, aborting):
        """records: [(key, partition or None)]"""
        producer.begin_transaction()
        written = []
        for key, partition in records:
            i = state["i"]
            state["i"] += 1
            kwargs = {"key": key.encode(), "value": json.dumps({"i": i}).encode()}
            if partition is not None:
                kwargs["partition"] = partition
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
            written.append(i)
        producer.poll(0)
        state["txns"] += 1
        if aborting:
            abort(written)
        else:
            commit(written)

    started = time.monotonic()
    interval = per_txn / rate
    n = 0
    while not stop.is_set() and time.monotonic() < deadline:
        n += 1
        transaction([(f"k{rng.randrange(keys)}", None) for _ in range(per_txn)],
                    aborting=abort_every > 0 and n % abort_every == 0)
        # Pace by the schedule, not by the time a transaction took, so the rate holds.
        wait = started + n * interval - time.monotonic()
        if wait > 0:
            stop.wait(wait)
    transaction([(f"tail-{p}", p) for p in range(int(spec["partitions"]))], aborting=False)
    producer.flush(30)
    json.dump({"committed": committed, "aborted": aborted, "transactions": state["txns"],
               "aborted_transactions": state["aborts"], "failed_commits": state["failed_commits"],
               "seconds": round(time.monotonic() - started, 3)}, sys.stdout)


if __name__ == "__main__":
    main()
