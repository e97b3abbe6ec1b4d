// A TCP proxy that cuts the connection at random offsets: it forwards
// 127.0.0.1:<port> to the server and, each time the bytes sent towards the
// server pass the next of `cuts` random points in (5%, 95%) of `total`,
// destroys both sides of the connection carrying them. Counting client
// bytes (headers included) makes every cut happen while an upload body is
// flowing. Used in-process by tus_js.js and as a process by tuspy_test.py:
//   node cut_proxy.js <upstream-port> <total-bytes> <cuts>   (prints the port, then "cut at N" lines)
"use strict";
const net = require("net");

function startCutProxy(upstreamPort, total, cuts, onCut) {
  const points = Array.from({ length: cuts }, () =>
    Math.floor(total * (0.05 + 0.9 * Math.random())),
  ).sort((a, b) => a - b);
  let sent = 0;
  const server = net.createServer((client) => {
    const upstream = net.connect(upstreamPort, "127.0.0.1");
    const cut = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("data", (chunk) => {
      sent += chunk.length;
      if (points.length > 0 && sent >= points[0]) {
        const at = points.shift();
        onCut(at);
        cut();
        return;
      }
      if (!upstream.write(chunk)) {
        client.pause();
        upstream.once("drain", () => client.resume());
      }
    });
    upstream.pipe(client);
    client.on("error", cut);
    upstream.on("error", cut);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({ port: server.address().port, left: () => points.length, close: () => server.close() }),
    ),
  );
}

module.exports = { startCutProxy };

if (require.main === module) {
  const [upstream, total, cuts] = process.argv.slice(2).map(Number);
  startCutProxy(upstream, total, cuts, (at) => console.log(`cut at ${at}`)).then((p) =>
    console.log(`port ${p.port}`),
  );
}
