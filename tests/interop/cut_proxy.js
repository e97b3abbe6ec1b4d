// A TCP proxy that cuts resumable uploads mid-body at random offsets: it
// forwards 127.0.0.1:<port> to the server and, each time the PATCH body
// bytes sent towards the server pass the next of `cuts` random points in
// (5%, 95%) of `total`, destroys both sides of the connection carrying them
// (only PATCH bodies are counted, so every cut lands in one). It also
// records each request's method, path and Upload-Offset, so that a test can
// tell a client that resumed from the server's offset from one that started
// over. Used in-process by tus_js.js and as a process by tuspy_test.py and
// the page test:
//   node cut_proxy.js <upstream-port> <total-bytes> <cuts>
// prints "port N", then "cut at N" and "request METHOD PATH OFFSET" lines.
// With `{ silent: true }` a cut closes only the client's side: the server's
// connection stays open and is sent nothing more (no FIN, no RST), as when
// a phone changes networks mid-PATCH.
"use strict";
const net = require("net");

/** A request head: method, path and Upload-Offset (-1 when absent). */
const HEAD = /(GET|HEAD|POST|PATCH|PUT|DELETE|OPTIONS) (\S+) HTTP\/1\.1\r\n([\s\S]*?)\r\n\r\n/;
/** The longest head kept while waiting for its end. */
const HEAD_MAX = 16 * 1024;

function startCutProxy(upstreamPort, total, cuts, onCut, onRequest = () => {}, { silent = false } = {}) {
  const points = Array.from({ length: cuts }, () =>
    Math.floor(total * (0.05 + 0.9 * Math.random())),
  ).sort((a, b) => a - b);
  const requests = [];
  let sent = 0;
  /** Server connections left open and silent, ended when the proxy closes. */
  const stalled = [];
  const server = net.createServer((client) => {
    const upstream = net.connect(upstreamPort, "127.0.0.1");
    let pending = "";
    let inPatch = false;
    let silenced = false;
    const cut = () => {
      client.destroy();
      upstream.destroy();
    };
    const silence = () => {
      silenced = true;
      upstream.unpipe(client);
      upstream.pause();
      stalled.push(upstream);
      client.destroy();
    };
    client.on("data", (chunk) => {
      // Heads are found in the bytes as they pass (latin1 keeps one char a byte).
      pending += chunk.toString("latin1");
      let bodyBytes = chunk.length;
      for (let m = HEAD.exec(pending); m; m = HEAD.exec(pending)) {
        const offset = /\r\nupload-offset: *(\d+)/i.exec(`\r\n${m[3]}`);
        const request = { method: m[1], path: m[2], offset: offset ? Number(offset[1]) : -1 };
        requests.push(request);
        onRequest(request);
        inPatch = m[1] === "PATCH";
        pending = pending.slice(m.index + m[0].length);
        bodyBytes = pending.length;
      }
      if (pending.length > HEAD_MAX) pending = pending.slice(-HEAD_MAX);
      if (inPatch) sent += Math.min(bodyBytes, chunk.length);
      if (inPatch && points.length > 0 && sent >= points[0]) {
        const at = points.shift();
        onCut(at);
        if (silent) silence();
        else cut();
        return;
      }
      if (!upstream.write(chunk)) {
        client.pause();
        upstream.once("drain", () => client.resume());
      }
    });
    upstream.pipe(client);
    client.on("error", () => (silenced ? client.destroy() : cut()));
    upstream.on("error", cut);
    client.on("close", () => silenced || upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        port: server.address().port,
        left: () => points.length,
        requests: () => requests,
        close: () => {
          server.close();
          stalled.forEach((s) => s.destroy());
        },
      }),
    ),
  );
}

/**
 * Whether `requests` show a client that resumed each cut upload from the
 * server's offset: one upload created, PATCH offsets never going back, and
 * at least one PATCH from an offset that is neither 0 nor a multiple of
 * `chunk` (the client's own chunk boundaries), i.e. where the server said it
 * stood. An error message, or null.
 */
function resumeProblem(requests, chunk) {
  const posts = requests.filter((r) => r.method === "POST").length;
  const offsets = requests.filter((r) => r.method === "PATCH").map((r) => r.offset);
  if (posts !== 1) return `${posts} uploads created (a client that starts over creates another)`;
  if (offsets.some((o, i) => i > 0 && o < offsets[i - 1])) return `PATCH offsets went back: ${offsets}`;
  if (!offsets.some((o) => o > 0 && o % chunk !== 0)) return `no PATCH resumed from the server's offset: ${offsets}`;
  return null;
}

module.exports = { startCutProxy, resumeProblem };

if (require.main === module) {
  const [upstream, total, cuts] = process.argv.slice(2).map(Number);
  startCutProxy(
    upstream,
    total,
    cuts,
    (at) => console.log(`cut at ${at}`),
    (r) => console.log(`request ${r.method} ${r.path} ${r.offset}`),
  ).then((p) => console.log(`port ${p.port}`));
}
