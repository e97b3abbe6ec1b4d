"""schemathesis hooks for scripts/contract.sh: tus PATCH bodies
(`application/offset+octet-stream`) are sent as raw bytes."""

import schemathesis
from schemathesis.transport.requests import binary_serializer

schemathesis.serializer("application/offset+octet-stream")(binary_serializer)
