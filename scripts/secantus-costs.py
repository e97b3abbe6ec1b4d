#!/usr/bin/env python3
"""What SecantusDB (the test stack's MongoDB) spends of its own CPU per write
of the kinds an event costs: an insert of an event (by its indexes), an
update of one (its place in the feed), alone, in a bulk write, or as small
marks instead. Starts its own SecantusDB on a free loopback port, from
`scripts/stack.sh install`'s venv; bounded (a few thousand writes).

    ~/.cache/filedock/secantus/bin/python scripts/secantus-costs.py

Read by BENCHMARKS 12 (what placing an event in the feed costs).
"""
import datetime
import os
import socket
import subprocess
import tempfile
import time
import uuid

import pymongo
from pymongo import ReturnDocument, UpdateOne

N = 600  # events per measure
BATCH = 20  # events per placing transaction


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_secs(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def event(owner, seq):
    return {
        "_id": f"{owner}:{seq}", "type": "file.created", "owner_id": owner, "seq": seq,
        "time": datetime.datetime.now(datetime.timezone.utc), "subject": str(uuid.uuid4()),
        "data": {"file_id": str(uuid.uuid4()), "filename": "bench.bin", "size": 4096,
                 "sha256": "ab" * 32, "content_type": "application/octet-stream"},
    }


def main():
    port, data = free_port(), tempfile.mkdtemp()
    server = subprocess.Popen(
        [os.path.expanduser("~/.cache/filedock/secantus/bin/secantusd-py"), "--host", "127.0.0.1",
         "--port", str(port), "--storage-path", f"{data}/m", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = None
        for _ in range(300):
            try:
                client = pymongo.MongoClient(
                    f"mongodb://127.0.0.1:{port}/?replicaSet=secantus", serverSelectionTimeoutMS=500)
                client.admin.command("ping")
                break
            except Exception:
                time.sleep(0.1)
        run(client, server.pid)
    finally:
        server.terminate()
        server.wait()


def run(client, pid):
    db = client.bench
    seqs = {}
    owners = [str(uuid.uuid4()) for _ in range(32)]

    def drafts(n, start):
        out = []
        for k in range(n):
            owner = owners[(start + k) % len(owners)]
            seqs[owner] = seqs.get(owner, 0) + 1
            out.append(event(owner, seqs[owner]))
        return out

    def measure(name, work):
        before = cpu_secs(pid)
        work()
        print(f"{name}: {(cpu_secs(pid) - before) * 1000 / N:.2f} ms of SecantusDB CPU per event",
              flush=True)

    def inserts(coll):
        def work():
            for i in range(0, N, 10):
                with client.start_session() as s, s.start_transaction():
                    coll.insert_many(drafts(10, i), session=s)
        return work

    # An insert, by the indexes of the collection.
    specs = {
        "_id only": [],
        "+ (owner_id, seq)": [[("owner_id", 1), ("seq", 1)]],
        "+ time": [[("owner_id", 1), ("seq", 1)], [("time", 1)]],
        "+ (feed, owner_id, seq): filedock's": [
            [("owner_id", 1), ("seq", 1)], [("time", 1)], [("feed", 1), ("owner_id", 1), ("seq", 1)]],
    }
    for k, (name, spec) in enumerate(specs.items()):
        coll = db[f"events{k}"]
        for index in spec:
            coll.create_index(index)
        measure(f"insert, in transactions of 10, indexes {name}", inserts(coll))
    events = db[f"events{len(specs) - 1}"]

    def take_places(s, counter, n):
        """The first of `n` places taken from feed counter `counter`, in session `s`."""
        state = db.feed_state.find_one_and_update(
            {"_id": counter}, {"$inc": {"last": n}}, upsert=True,
            return_document=ReturnDocument.AFTER, session=s)
        return state["last"] - n + 1

    def place(bulk):
        def work():
            while True:
                with client.start_session() as s, s.start_transaction():
                    found = list(events.find({"feed": None}, {"_id": 1}, session=s)
                                 .sort([("feed", 1), ("owner_id", 1), ("seq", 1)]).limit(BATCH))
                    if not found:
                        return
                    first = take_places(s, "s", len(found))
                    updates = [({"_id": e["_id"], "feed": None}, {"$set": {"feed": first + k}})
                               for k, e in enumerate(found)]
                    if bulk:
                        events.bulk_write([UpdateOne(q, u) for q, u in updates], session=s)
                    else:
                        for q, u in updates:
                            events.update_one(q, u, session=s)
        return work

    # Placing what the inserts above wrote (N), then again with more
    # placed before: N more each round.
    for round_ in range(3):
        bulk = round_ % 2 == 1
        how = "one bulk update" if bulk else "an update each"
        measure(f"placing {BATCH} at a time, {how}, {round_ * N} placed before", place(bulk))
        inserts(events)()
    measure(f"placing {BATCH} at a time, an update each, {3 * N} placed before", place(False))

    # The other way to place: the commit inserts into a small outbox
    # (`_id` and `(owner_id, seq)` only); placing moves a batch into the
    # events (inserted with their place) in one transaction: a find, the
    # counter, one insert_many, one delete_many.
    outbox, placed = db.outbox, db.placed
    outbox.create_index([("owner_id", 1), ("seq", 1)])
    for index in specs["+ (feed, owner_id, seq): filedock's"]:
        placed.create_index(index)
    measure("insert into the outbox, in transactions of 10", inserts(outbox))

    def move(batch):
        def work():
            while True:
                with client.start_session() as s, s.start_transaction():
                    found = list(outbox.find({}, session=s)
                                 .sort([("owner_id", 1), ("seq", 1)]).limit(batch))
                    if not found:
                        return
                    first = take_places(s, "m", len(found))
                    for k, e in enumerate(found):
                        e["feed"] = first + k
                    placed.insert_many(found, session=s)
                    outbox.delete_many({"_id": {"$in": [e["_id"] for e in found]}}, session=s)
        return work

    measure(f"moving {BATCH} at a time from the outbox", move(BATCH))
    inserts(outbox)()
    measure("moving 200 at a time from the outbox", move(200))


if __name__ == "__main__":
    main()
