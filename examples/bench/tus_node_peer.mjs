// The peer of BENCHMARKS scenario 13: tus-node-server (@tus/server) with
// @tus/s3-store, on the same S3 server as filedock. Started by the bench
// (examples/bench/small_tus.rs) with NODE_PATH at the npm install it made;
// listens on 127.0.0.1:$PORT, path /files, and stores in $S3_BUCKET.
// Usage: node tus_node_peer.mjs (env: PORT, S3_ENDPOINT, S3_ACCESS_KEY,
// S3_SECRET_KEY, S3_BUCKET).
import http from 'node:http';
import { createRequire } from 'node:module';

// ESM ignores NODE_PATH: resolve the packages from the bench's install.
const require = createRequire(`${process.env.NODE_PATH}/`);
const { Server } = await import(require.resolve('@tus/server'));
const { S3Store } = await import(require.resolve('@tus/s3-store'));
const { S3Client, CreateBucketCommand } = await import(require.resolve('@aws-sdk/client-s3'));

const s3Client = {
  endpoint: process.env.S3_ENDPOINT,
  region: 'us-east-1',
  forcePathStyle: true,
  credentials: {
    accessKeyId: process.env.S3_ACCESS_KEY,
    secretAccessKey: process.env.S3_SECRET_KEY,
  },
};
const bucket = process.env.S3_BUCKET;
try {
  await new S3Client(s3Client).send(new CreateBucketCommand({ Bucket: bucket }));
} catch (e) {
  if (e.name !== 'BucketAlreadyOwnedByYou' && e.name !== 'BucketAlreadyExists') throw e;
}
const server = new Server({
  path: '/files',
  datastore: new S3Store({
    partSize: 8 * 1024 * 1024,
    s3ClientConfig: { bucket, ...s3Client },
  }),
});
http.createServer((req, res) => server.handle(req, res))
  .listen(Number(process.env.PORT), '127.0.0.1', () => console.log('ready'));
