// A real S3 server (s3rver, from npm) on a free loopback port, with one bucket, its objects as
// files under DIR: `node server.cjs DIR BUCKET [PORT]` prints {"port": N} once it listens (PORT
// given: that one, e.g. the same server started again). Why s3rver:
// one process that starts in a second, speaks the S3 REST API (path-style, ListObjectsV2, HEAD,
// errors as S3's XML) and checks that requests carry a well-formed AWS4 signature with a known
// access key (S3RVER); it does not recompute the signature, which sigv4_test.cc checks against
// AWS's own examples. Ceph's radosgw (Debian) is the heavier, fully checking alternative.
const S3rver = require('s3rver');

const [dir, bucket, port] = process.argv.slice(2);
const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port || 0),
  directory: dir,
  silent: true,
  configureBuckets: [{ name: bucket || 'pandastack' }],
});
server.run().then(({ port }) => console.log(JSON.stringify({ port })));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close().then(() => process.exit(0)));
