"""How a MongoDB-compatible server plans filedock's list query, and how its
time grows with the files one owner holds (issue 22).

filedock lists a user's files with find({owner_id, _id > cursor}) sorted by
_id, limit n, on the (owner_id, _id) index (src/meta/mongo: find_sorted,
owned_after). This inserts N files for one owner (and a few for another),
times the first page and prints the winning plan's stages.

  ~/.cache/filedock/secantus/bin/python scripts/explain-list.py MONGODB_URI [N ...]
"""

import sys
import time
import uuid

import pymongo

PAGE = 100
TRIES = 5


def stages(plan):
    out = []
    while plan:
        out.append(plan.get("stage"))
        plan = plan.get("inputStage")
    return " <- ".join(out)


def main():
    uri, sizes = sys.argv[1], [int(n) for n in sys.argv[2:]] or [1000, 10000]
    db = pymongo.MongoClient(uri)["filedock_explain_" + uuid.uuid4().hex[:8]]
    db.files.create_index([("owner_id", 1), ("_id", 1)])
    held = 0
    try:
        for n in sizes:
            docs = [{"_id": str(uuid.uuid4()), "owner_id": "owner", "size": 1} for _ in range(n - held)]
            docs += [{"_id": str(uuid.uuid4()), "owner_id": "other", "size": 1} for _ in range(10)]
            for i in range(0, len(docs), 1000):
                db.files.insert_many(docs[i : i + 1000])
            held = n
            query = lambda: db.files.find({"owner_id": "owner"}).sort("_id", 1).limit(PAGE)
            start = time.perf_counter()
            for _ in range(TRIES):
                assert len(list(query())) == PAGE
            ms = (time.perf_counter() - start) / TRIES * 1000
            plan = query().explain()["queryPlanner"]["winningPlan"]
            print(f"{n:>7} files: first page {ms:8.1f} ms; plan {stages(plan)}")
    finally:
        db.client.drop_database(db.name)


if __name__ == "__main__":
    main()
