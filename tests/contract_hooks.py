"""schemathesis hooks for scripts/contract.sh: tus PATCH bodies
(`application/offset+octet-stream`) are sent as raw bytes."""

import schemathesis
from schemathesis.transport.requests import binary_serializer

schemathesis.serializer("application/offset+octet-stream")(binary_serializer)


@schemathesis.hook
def map_query(ctx, query):
    """A long poll's `wait` (up to 60 s) holds its request that long when
    there is no event: generated reads wait at most a second."""
    wait = query.get("wait") if query else None
    # Only a valid one: an invalid one (past 60) must still be refused.
    if isinstance(wait, int) and 1 < wait <= 60:
        query["wait"] = 1
    return query
