"""tuspy (PyPI) against filedock through the cutting proxy (cut_proxy.js):
a 64 MiB upload cut at least 3 times, resumed by tuspy's retries (HEAD, then
PATCH from the server's offset: the proxy's record of the requests shows it
did not start over), downloaded and compared byte for byte.

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
    lines = proxy.stdout.readlines()
    cuts = sum(1 for line in lines if line.startswith("cut at"))
    requests = [line.split()[1:] for line in lines if line.startswith("request ")]
    file_id = uploader.url.rsplit("/", 1)[-1]
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/files/{file_id}/content",
        headers={"Authorization": f"Bearer {key}"},
    )
    got = urllib.request.urlopen(req).read()
    assert got == data, f"download differs: {len(got)} bytes"
    assert cuts >= CUTS, f"only {cuts} cuts happened"
    # One upload created; PATCH offsets never go back; one resumed from where
    # the server stood (not a chunk boundary of the client's).
    posts = sum(1 for r in requests if r[0] == "POST")
    offsets = [int(r[2]) for r in requests if r[0] == "PATCH"]
    assert posts == 1, f"{posts} uploads created (a client that starts over creates another)"
    assert offsets == sorted(offsets), f"PATCH offsets went back: {offsets}"
    resumed = [o for o in offsets if o > 0 and o % CHUNK != 0]
    assert resumed, f"no PATCH resumed from the server's offset: {offsets}"
    print(f"tuspy: {SIZE} bytes, {cuts} cuts, resumed from {resumed}, byte-identical (file {file_id})")


if __name__ == "__main__":
    main()
