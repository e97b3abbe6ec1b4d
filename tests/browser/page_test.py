"""The upload page (GET /) in headless Chromium: paste a token, upload three
files (one of 50 MiB, resumable, whose PATCH loses its connection mid-body,
through the cutting proxy of tests/interop) and watch their progress bars
move, see it resume from the offset the server stored, download one and
compare its bytes, delete one, see an API error shown as the API words it.

usage: page_test.py BASE_URL ADMIN_KEY WORK_DIR SCREENSHOT_DIR
"""

import atexit
import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

BASE, ADMIN, WORK, SHOTS = sys.argv[1:5]
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("ok   " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))


def api(method, path, key, body=None):
    req = urllib.request.Request(BASE + path, method=method, data=body and json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + key)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req) as res:
        return json.loads(res.read() or b"null")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_file(name, size):
    path = os.path.join(WORK, name)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    return path


key = api("POST", "/v1/admin/users", ADMIN, {"name": "browser"})["api_key"]
# The page gets a short-lived token, never the key (issue 25).
token = api("POST", "/v1/tokens", key, {"scopes": ["files:read", "files:write"], "expires_in": 900})["token"]
BIG = 50 << 20
paths = [make_file("notes.txt", 3_000), make_file("photo.bin", 1 << 20), make_file("big.bin", BIG)]

# The page goes through a proxy that cuts the big file's PATCH once, at a
# random point of its body (5-95 %), after those bytes reached the server.
cut_proxy = Path(__file__).resolve().parent.parent / "interop" / "cut_proxy.js"
proxy = subprocess.Popen(
    ["node", str(cut_proxy), BASE.rsplit(":", 1)[1], str(BIG), "1"], stdout=subprocess.PIPE, text=True
)
atexit.register(proxy.terminate)
PAGE = "http://127.0.0.1:" + proxy.stdout.readline().split()[1]

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
    page = browser.new_page(accept_downloads=True)
    page.goto(PAGE + "/")
    page.fill("#key", token)
    page.press("#key", "Tab")  # a change event: the page stores the token and lists files

    # Record every value each progress bar takes, and slow the uploads a
    # little so that a 50 MiB one on loopback shows more than 0 and 100.
    page.evaluate(
        """() => {
            window.seen = {};
            new MutationObserver((changes) => {
                for (const c of changes) {
                    const name = c.target.parentElement.querySelector('.name').textContent;
                    (window.seen[name] ||= []).push(Number(c.target.value));
                }
            }).observe(document.getElementById('uploads'),
                       {attributes: true, subtree: true, attributeFilter: ['value']});
        }"""
    )
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 40 << 20},
    )
    patches = []
    page.on("request", lambda r: patches.append(r.headers.get("upload-offset")) if r.method == "PATCH" else None)
    # The big file's PATCH loses its connection: the resumable upload asks
    # the server where it stands (HEAD) and sends the rest from there.
    page.set_input_files("#pick", paths)
    try:
        page.wait_for_function("document.querySelectorAll('#files tr').length === 3", timeout=180_000)
    except Exception:
        print("uploads:", page.text_content("#uploads"), "| error:", page.text_content("#error"), "| PATCHes:", patches)
        raise
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    statuses = page.eval_on_selector_all(".upload .status", "els => els.map(e => e.textContent)")
    check("three uploads done", statuses == ["done"] * 3, str(statuses))
    seen = page.evaluate("window.seen")
    moving = [v for v in seen.get("big.bin", []) if 0 < v < 100]
    check("the 50 MiB upload's progress bar moved", len(moving) >= 2, str(seen.get("big.bin")))
    listed = sorted(f["filename"] for f in api("GET", "/v1/files", key)["files"])
    check("the API lists the three files", listed == ["big.bin", "notes.txt", "photo.bin"], str(listed))
    page.screenshot(path=os.path.join(SHOTS, "page.png"), full_page=True)

    with page.expect_download() as download:
        page.click("#files tr:has(td.name:text-is('big.bin')) button.get")
    got = download.value.path()
    check("the downloaded file has the uploaded bytes", sha256(got) == sha256(paths[2]))

    page.click("#files tr:has(td.name:text-is('notes.txt')) button.del")
    page.wait_for_function("document.querySelectorAll('#files tr').length === 2")
    listed = sorted(f["filename"] for f in api("GET", "/v1/files", key)["files"])
    check("delete removed the file", listed == ["big.bin", "photo.bin"], str(listed))

    page.fill("#key", "not-a-key")
    page.press("#key", "Tab")
    page.wait_for_function("document.getElementById('error').textContent !== ''")
    shown = page.text_content("#error")
    check("an API error is shown in the API's words", shown == "missing or invalid API key", shown)
    browser.close()

proxy.terminate()
seen = [line.split() for line in proxy.stdout.readlines()]
cuts = [line for line in seen if line[0] == "cut"]
offsets = [int(line[3]) for line in seen if line[:2] == ["request", "PATCH"]]
check("the 50 MiB upload's PATCH was cut mid-body", len(cuts) == 1, str(seen))
check(
    "the 50 MiB upload resumed from the server's offset, not from 0",
    len(offsets) >= 2 and offsets[0] == 0 and offsets[-1] > 0 and offsets == sorted(offsets),
    f"PATCH offsets {offsets} (the page saw {patches})",
)

passed = sum(results)
print(f"{passed} passed, {len(results) - passed} failed")
sys.exit(0 if passed == len(results) else 1)
