// tus-js-client (the tus reference client) against filedock through the
// cutting proxy: a 64 MiB upload cut at least 3 times, resumed by the
// client itself (HEAD, then PATCH from the server's offset: the proxy's
// record of the requests shows it did not start over), then downloaded and
// compared byte for byte.
//   NODE_PATH=<dir with tus-js-client> node tus_js.js <server-port> <api-key>
"use strict";
const crypto = require("crypto");
const tus = require("tus-js-client");
const { resumeProblem, startCutProxy } = require("./cut_proxy");

const SIZE = 64 * 1024 * 1024;
const CUTS = 3;

async function main() {
  const [port, key] = [Number(process.argv[2]), process.argv[3]];
  const data = crypto.randomBytes(SIZE);
  let cuts = 0;
  const proxy = await startCutProxy(port, SIZE, CUTS, () => cuts++);
  const base = `http://127.0.0.1:${proxy.port}`;
  const url = await new Promise((resolve, reject) => {
    const upload = new tus.Upload(data, {
      endpoint: `${base}/v1/uploads`,
      headers: { Authorization: `Bearer ${key}` },
      metadata: { filename: "tus-js.bin", filetype: "application/octet-stream" },
      uploadSize: SIZE,
      retryDelays: [0, 100, 200, 500, 1000, 1000, 1000],
      onError: reject,
      onSuccess: () => resolve(upload.url),
    });
    upload.start();
  });
  proxy.close();
  const id = url.split("/").pop();
  const res = await fetch(`http://127.0.0.1:${port}/v1/files/${id}/content`, {
    headers: { Authorization: `Bearer ${key}` },
  });
  const got = Buffer.from(await res.arrayBuffer());
  if (res.status !== 200 || !got.equals(data)) {
    throw new Error(`download: ${res.status}, ${got.length} bytes, identical: ${got.equals(data)}`);
  }
  if (cuts < CUTS) throw new Error(`only ${cuts} cuts happened`);
  // One PATCH of the whole file (no chunk size): any later one resumed.
  const problem = resumeProblem(proxy.requests(), SIZE);
  if (problem) throw new Error(`did not resume: ${problem}`);
  const offsets = proxy.requests().filter((r) => r.method === "PATCH").map((r) => r.offset);
  console.log(`tus-js-client: ${SIZE} bytes, ${cuts} cuts, resumed from ${offsets.slice(1)}, byte-identical (file ${id})`);
}

main().catch((e) => {
  console.error(`tus-js-client interop FAILED: ${e.stack || e}`);
  process.exit(1);
});
