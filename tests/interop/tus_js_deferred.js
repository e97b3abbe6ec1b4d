// tus-js-client with a deferred length (creation-defer-length), as Uppy
// Companion uploads (uppy#5560): a 21 MiB stream of unknown size, sent in
// 5 MiB chunks; the client declares Upload-Length only when the stream
// ends. The server must answer HEAD with Upload-Defer-Length: 1 meanwhile,
// and commit the file byte-identical once the length is declared.
//   NODE_PATH=<dir with tus-js-client> node tus_js_deferred.js <server-port> <api-key>
"use strict";
const crypto = require("crypto");
const { Readable } = require("stream");
const tus = require("tus-js-client");

const SIZE = 21 * 1024 * 1024 + 333;
const CHUNK = 5 * 1024 * 1024;
const PIECE = 256 * 1024;

async function main() {
  const [port, key] = [Number(process.argv[2]), process.argv[3]];
  const base = `http://127.0.0.1:${port}`;
  const auth = { Authorization: `Bearer ${key}` };
  const data = crypto.randomBytes(SIZE);
  // A stream that does not say how long it is.
  const stream = Readable.from(
    (function* () {
      for (let at = 0; at < SIZE; at += PIECE) yield data.subarray(at, at + PIECE);
    })(),
  );
  let deferredSeen = false;
  const url = await new Promise((resolve, reject) => {
    const upload = new tus.Upload(stream, {
      endpoint: `${base}/v1/uploads`,
      headers: auth,
      metadata: { filename: "deferred.bin", filetype: "application/octet-stream" },
      uploadLengthDeferred: true,
      chunkSize: CHUNK,
      retryDelays: [0, 100, 500],
      onChunkComplete: async (_chunk, sent) => {
        // Before the last chunk, the server still says the length is deferred.
        if (sent < SIZE && !deferredSeen) {
          const res = await fetch(upload.url, {
            method: "HEAD",
            headers: { ...auth, "Tus-Resumable": "1.0.0" },
          });
          deferredSeen =
            res.headers.get("upload-defer-length") === "1" && !res.headers.has("upload-length");
        }
      },
      onError: reject,
      onSuccess: () => resolve(upload.url),
    });
    upload.start();
  });
  const id = url.split("/").pop();
  const res = await fetch(`${base}/v1/files/${id}/content`, { headers: auth });
  const got = Buffer.from(await res.arrayBuffer());
  if (res.status !== 200 || !got.equals(data)) {
    throw new Error(`download: ${res.status}, ${got.length} bytes, identical: ${got.equals(data)}`);
  }
  if (!deferredSeen) throw new Error("HEAD never answered Upload-Defer-Length: 1 mid-upload");
  console.log(`tus-js-client (deferred length): ${SIZE} bytes in ${CHUNK}-byte chunks, byte-identical (file ${id})`);
}

main().catch((e) => {
  console.error(`tus-js-client deferred-length interop FAILED: ${e.stack || e}`);
  process.exit(1);
});
