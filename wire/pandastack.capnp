# The public Cap'n Proto RPC API of pandastackd (on --rpc-listen and DATA/rpc.sock).
#
#   bootstrap (Login) -> login(apiKey) -> Platform -> create(...) -> Sandbox -> exec(...)
#
# Capabilities pipeline: `platform.create(...).sandbox.exec(...)` is sent in one network round
# trip. Errors are exceptions whose description starts with the REST API's error code:
# "sandbox_not_found: no sandbox sbx_...". Ordinals are append-only.
@0x8b9c2b31ddfc0d84;

$import "/capnp/c++.capnp".namespace("pandastack::wire::api");

struct Entry {
  key @0 :Text;
  value @1 :Text;
}

struct SandboxInfo {
  id @0 :Text;
  template @1 :Text;
  state @2 :Text;            # creating, running, ..., hibernated, stopped, failed
  createdAtMs @3 :Int64;
  expiresAtMs @4 :Int64;
  persistent @5 :Bool;
  metadata @6 :List(Entry);
  parent @7 :Text;
  snapshots @8 :List(Text);
  failureReason @9 :Text;
  memoryMib @10 :UInt32;     # its guest's shape: its template's
  vcpus @11 :UInt32;
  durable @12 :Text;         # hibernated: "remote" (in the object store too), "local" (a synced
                             # copy on the data disk) or "none"
                             # (tmpfs only so far); otherwise ""
}

struct SecretInfo {          # a tenant secret, never its value (REST's /v1/secrets)
  name @0 :Text;
  hosts @1 :List(Text);      # where its value may be sent
  version @2 :UInt32;        # bumped by each rotation
  createdAtMs @3 :Int64;
  updatedAtMs @4 :Int64;
  expiresAtMs @5 :Int64;     # 0 = never
  injectInto @6 :List(Text); # where the proxy may put its value: headers, query, body
  allowPlainHttp @7 :Bool;   # plain HTTP requests may carry it too (else HTTPS only)
}

struct EgressEntry {         # one line of a sandbox's egress log (REST's .../egress)
  seq @0 :UInt64;
  timestampMs @1 :Int64;
  kind @2 :Text;             # dns, connection, secret (a request that carried a placeholder)
  verdict @3 :Text;          # allowed, denied
  reason @4 :Text;           # denied: policy, reserved, internal, rate_limit, unique_names, malformed,
                             # not_secret_host, plain_http
  name @5 :Text;             # dns: the name asked; connection: the name answered for the address
  type @6 :Text;             # dns: A, AAAA, ...
  answers @7 :List(Text);    # dns: the IPv4 answers
  protocol @8 :Text;         # connection: tcp, udp
  destination @9 :Text;
  port @10 :UInt16;
  bytesOut @11 :UInt64;      # allowed connections
  bytesIn @12 :UInt64;
  endedMs @13 :Int64;        # 0 = still open
  method @14 :Text;          # secret: the request's method
  injected @15 :List(Text);  # secret: the secrets put in
  refused @16 :List(Text);   # secret: placeholders left as they were (not this host's; plain HTTP)
}

struct CreateRequest {
  template @0 :Text;         # empty = "base"
  ttlSeconds @1 :UInt32;     # 0 = the daemon's default
  metadata @2 :List(Entry);
  persistent @3 :Bool;
  autoWake @4 :Bool;
  fromSnapshot @5 :Text;
  volumes @6 :List(VolumeMount);  # at most 4, mounted when create returns
  memoryMib @7 :UInt32;      # 0 = the template's; more than the template's is refused
  vcpus @8 :UInt32;          #   (exceeds_template): a sandbox has its template's shape
  secrets @9 :List(Text);    # the tenant's secrets its requests may carry (REST's `secrets`)
}

struct VolumeMount {
  volume @0 :Text;           # vol_...
  mount @1 :Text;            # absolute guest path
  readOnly @2 :Bool;
}

struct VolumeInfo {
  id @0 :Text;
  name @1 :Text;
  status @2 :Text;           # available
  sizeMib @3 :UInt64;
  attachedTo @4 :List(Text); # sandbox ids holding it
}

struct DatabaseRequest {
  name @0 :Text;             # the role's and the database's name: [a-z][a-z0-9_]{0,62}
  metadata @1 :List(Entry);
  fromBackup @2 :Text;       # bk_...: restore one of the tenant's backups into the new database
}

struct DatabaseBackup {
  id @0 :Text;               # bk_...
  bytes @1 :UInt64;
  createdAtMs @2 :Int64;     # pg_dump custom format, kept on the host
}

struct DatabaseInfo {
  id @0 :Text;               # db_...
  name @1 :Text;
  status @2 :Text;           # running, hibernated, starting, failed (failureReason): its sandbox's real state
  metadata @3 :List(Entry);
  host @4 :Text;             # "" while hibernated
  port @5 :UInt16;
  user @6 :Text;
  database @7 :Text;
  connectionUri @8 :Text;    # with the password only in the answers of create and rotatePassword
  password @9 :Text;         # only there: it is stored nowhere
  createdAtMs @10 :Int64;
  backups @11 :List(DatabaseBackup);
  restoredFrom @12 :Text;
  sandbox @13 :Text;
  volume @14 :Text;
  failureReason @15 :Text;   # failed: why (its sandbox was stopped or failed); the data volume is kept
}

struct ExecRequest {
  argv @0 :List(Text);       # used when non-empty
  cmd @1 :Text;              # else run with /bin/sh -c
  env @2 :List(Entry);
  cwd @3 :Text;
  stdin @4 :Data;
  timeoutSeconds @5 :UInt32; # 0 = the daemon's default (60 s)
  user @6 :Text;             # as this account of the guest ("" = root; every template has `user`)
}

struct ExecResult {
  exitCode @0 :Int32;
  timedOut @1 :Bool;
  stdout @2 :Data;
  stderr @3 :Data;
  stdoutTruncated @4 :Bool;
  stderrTruncated @5 :Bool;
  durationMs @6 :Float64;
}

enum StreamKind {
  stdout @0;
  stderr @1;
}

interface OutputSink {
  write @0 (kind :StreamKind, data :Data) -> stream;
}

struct FileEntry {
  name @0 :Text;
  type @1 :Text;             # file, directory, symlink, other
  size @2 :UInt64;
  mode @3 :UInt32;
  mtimeMs @4 :Int64;
}

interface Login {
  login @0 (apiKey :Text) -> (platform :Platform);
}

interface Platform {
  create @0 (request :CreateRequest) -> (sandbox :Sandbox, info :SandboxInfo);
  get @1 (id :Text) -> (sandbox :Sandbox, info :SandboxInfo);
  list @2 (state :Text) -> (sandboxes :List(SandboxInfo));  # state "" = any
  deleteSnapshot @3 (snapshotId :Text) -> ();
  # One of this tenant's snapshots (Sandbox.snapshot): creates from it fail afterwards
  # (snapshot_not_found); sandboxes created from it run on.
  createVolume @4 (name :Text, sizeMib :UInt64) -> (info :VolumeInfo);
  listVolumes @5 () -> (volumes :List(VolumeInfo));
  deleteVolume @6 (id :Text) -> ();
  # Volumes (data that outlives sandboxes), attached with CreateRequest.volumes; errors as REST:
  # volume_not_found, volume_in_use, volume_attached, quota_exceeded.
  createDatabase @7 (request :DatabaseRequest) -> (database :Database, info :DatabaseInfo);
  getDatabase @8 (id :Text) -> (database :Database, info :DatabaseInfo);
  listDatabases @9 () -> (databases :List(DatabaseInfo));
  listSecrets @10 () -> (secrets :List(SecretInfo));
  # Managed PostgreSQL (REST's /v1/databases); errors as REST: database_not_found,
  # database_hibernated, backup_not_found, quota_exceeded, backup_too_large, ...
}

interface Database {
  info @0 () -> (info :DatabaseInfo);
  hibernate @1 () -> (info :DatabaseInfo);
  wake @2 () -> (info :DatabaseInfo);        # the same URI works again; host/port may change
  rotatePassword @3 () -> (info :DatabaseInfo);
  backup @4 () -> (backup :DatabaseBackup);
  deleteBackup @5 (backupId :Text) -> (info :DatabaseInfo);
  logs @6 (lines :UInt32) -> (log :Text);   # 0 = 200, at most 10000
  delete @7 () -> ();                        # its server, its data volume and its backups
}

interface Sandbox {
  info @0 () -> (info :SandboxInfo);
  exec @1 (request :ExecRequest) -> (result :ExecResult);
  # Output goes to `sink` as it is produced; the result then has no output. Cancelling the call
  # (dropping its promise) kills the command in the guest.
  execStream @2 (request :ExecRequest, sink :OutputSink) -> (result :ExecResult);
  readFile @3 (path :Text) -> (data :Data);
  writeFile @4 (path :Text, data :Data) -> ();
  listDir @5 (path :Text) -> (entries :List(FileEntry));
  snapshot @6 () -> (snapshotId :Text);
  fork @7 (count :UInt32, inheritSecrets :Bool) -> (children :List(Sandbox), infos :List(SandboxInfo));
  hibernate @8 () -> (info :SandboxInfo);
  wake @9 () -> (info :SandboxInfo);
  kill @10 () -> (info :SandboxInfo);
  setTtl @11 (ttlSeconds :UInt32) -> (info :SandboxInfo);
  # One copy of the running sandbox (fork with a count of 1), as a capability a client can
  # pipeline on: `sandbox.forkOne().sandbox.exec(...)` is one round trip.
  forkOne @12 () -> (sandbox :Sandbox, info :SandboxInfo);
  # What it reached and was refused (REST's GET .../egress): entries after `after` (a seq; 0 =
  # the oldest kept), at most `limit` (0 = 100, at most 1000); kind "dns" | "connection" | "",
  # verdict "allowed" | "denied" | "". network_disabled for a sandbox without a network.
  egressLog @13 (after :UInt64, limit :UInt32, kind :Text, verdict :Text)
      -> (entries :List(EgressEntry), nextAfter :UInt64, dropped :UInt64, lost :UInt64);
}
