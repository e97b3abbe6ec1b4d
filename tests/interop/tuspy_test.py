"""tuspy (PyPI) against filedock through the cutting proxy (cut_proxy.js):
a 64 MiB upload cut at least 3 times, resumed by tuspy's retries (HEAD, then
PATCH from the server's offset), downloaded and compared byte for byte.

    python tuspy_test.py <server-port> <api-key>
"""

import io
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from tusclient import client

SIZE = 64 * 1024 * 1024
CUTS = 3
CHUNK = 16 * 1024 * 1024


def main() -> None:
    port, key = int(sys.argv[1]), sys.argv[2]
    data = os.urandom(SIZE)
    proxy = subprocess.Popen(
        ["node", str(Path(__file__).with_name("cut_proxy.js")), str(port), str(SIZE), str(CUTS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proxy.stdout.readline().split()
        assert line[0] == "port", line
        tus = client.TusClient(
            f"http://127.0.0.1:{line[1]}/v1/uploads", headers={"Authorization": f"Bearer {key}"}
        )
        uploader = tus.uploader(
            file_stream=io.BytesIO(data),
            chunk_size=CHUNK,
            metadata={"filename": "tuspy.bin", "filetype": "application/octet-stream"},
            retries=20,
            retry_delay=0.2,
        )
        uploader.upload()
    finally:
        proxy.terminate()
    cuts = sum(1 for line in proxy.stdout if line.startswith("cut at"))
    file_id = uploader.url.rsplit("/", 1)[-1]
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/files/{file_id}/content",
        headers={"Authorization": f"Bearer {key}"},
    )
    got = urllib.request.urlopen(req).read()
    assert got == data, f"download differs: {len(got)} bytes"
    assert cuts >= CUTS, f"only {cuts} cuts happened"
    print(f"tuspy: {SIZE} bytes, {cuts} cuts, resumed, byte-identical (file {file_id})")


if __name__ == "__main__":
    main()
