// tus-js-client with its default options (retry delays 0, 1, 3, 5 s)
// against filedock through a proxy that, mid-PATCH, drops the client's
// side of the connection and leaves the server's open and silent (no FIN,
// no RST: a phone that changed networks). The server holds that PATCH's
// lock; the client's HEAD asks it to store what arrived and let go (a
// lock-release request), so the client resumes within its retries. Then
// one upload was created, the download is byte-identical, and the user
// has one file.
//   NODE_PATH=<dir with tus-js-client> node tus_js_silent.js <server-port> <api-key>
"use strict";
const crypto = require("crypto");
const tus = require("tus-js-client");
const { startCutProxy } = require("./cut_proxy");

const SIZE = 16 * 1024 * 1024;

async function main() {
  const [port, key] = [Number(process.argv[2]), process.argv[3]];
  const auth = { Authorization: `Bearer ${key}` };
  const data = crypto.randomBytes(SIZE);
  let cuts = 0;
  const proxy = await startCutProxy(port, SIZE, 1, () => cuts++, () => {}, { silent: true });
  const started = Date.now();
  const url = await new Promise((resolve, reject) => {
    const upload = new tus.Upload(data, {
      endpoint: `http://127.0.0.1:${proxy.port}/v1/uploads`,
      headers: auth,
      metadata: { filename: "tus-js-silent.bin", filetype: "application/octet-stream" },
      uploadSize: SIZE,
      onError: reject,
      onSuccess: () => resolve(upload.url),
    });
    upload.start();
  });
  const took = Date.now() - started;
  const requests = proxy.requests();
  proxy.close();
  if (cuts !== 1) throw new Error(`${cuts} silent drops happened, not 1`);
  const posts = requests.filter((r) => r.method === "POST").length;
  if (posts !== 1) throw new Error(`${posts} uploads created`);
  const id = url.split("/").pop();
  const res = await fetch(`http://127.0.0.1:${port}/v1/files/${id}/content`, { headers: auth });
  const got = Buffer.from(await res.arrayBuffer());
  if (res.status !== 200 || !got.equals(data)) {
    throw new Error(`download: ${res.status}, ${got.length} bytes, identical: ${got.equals(data)}`);
  }
  const list = await (await fetch(`http://127.0.0.1:${port}/v1/files`, { headers: auth })).json();
  if (list.files.length !== 1) throw new Error(`${list.files.length} files, not 1`);
  const offsets = requests.filter((r) => r.method === "PATCH").map((r) => r.offset);
  console.log(`tus-js-client (default retries): ${SIZE} bytes, a silent drop, resumed from ${offsets.slice(1)} in ${took} ms, byte-identical, one file (${id})`);
}

main().catch((e) => {
  console.error(`tus-js-client silent-drop interop FAILED: ${e.stack || e}`);
  process.exit(1);
});
