# Host <-> guest agent protocol: Cap'n Proto RPC over the virtio-serial port "agent".
#
# The host is the client; the agent's bootstrap capability is `Agent`. Field ordinals are
# append-only: a newer host must keep talking to an older agent baked into a snapshot, so never
# renumber or change a field's type. `protocolVersion` in `health` is bumped on incompatible change.
@0xfc72297826f2cfca;

$import "/capnp/c++.capnp".namespace("pandastack::wire::agent");

const protocolVersion :UInt32 = 3;
# 2: ExecRequest.user, writeFile/mkdir `owner`, FileStat owner/group/symlinkTarget (an agent of 1
#    ignores them: the host refuses to ask it for another user; vmm-driver/agent_client.h).
# 3: file metadata (FileStat.metadata, writeFile `metadata`/`setMetadata`), watch `includeEntry`
#    (an agent of 2 ignores them: the host refuses to ask it for either).

struct EnvVar {
  name @0 :Text;
  value @1 :Text;
}

struct ExecRequest {
  # Exactly one of argv / shell is used: argv (non-empty) is executed directly, otherwise `shell`
  # runs under `/bin/sh -c`.
  argv @0 :List(Text);
  shell @1 :Text;
  env @2 :List(EnvVar);      # added to (and overriding) the agent's base environment
  cwd @3 :Text;              # empty = /workspace (or / when missing)
  stdin @4 :Data;            # written to the command's stdin, then stdin is closed
  timeoutMs @5 :UInt32;      # 0 = no timeout; on expiry the whole process group gets SIGKILL
  maxOutputBytes @6 :UInt32; # cap per stream for buffered exec; 0 = agent default (16 MiB)
  keepStdinOpen @7 :Bool;    # startProcess only: stdin stays open for writeStdin (after `stdin`)
  pty @8 :Bool;              # run on a new pseudo-terminal (its controlling terminal): stdin,
                             # stdout and stderr are the terminal; all output comes as stdout;
                             # a background process's input stays open (writeStdin, resizePty)
  cols @9 :UInt16;           # the terminal's size; 0 = 80 columns, 24 rows
  rows @10 :UInt16;
  user @11 :Text;            # run as this account of the guest's /etc/passwd ("" = root): its
                             # uid, gid and groups; HOME, USER, LOGNAME; cwd defaults to its home
}

struct ExecResult {
  exitCode @0 :Int32;        # exit status, or -signal when killed by a signal
  timedOut @1 :Bool;
  stdout @2 :Data;
  stderr @3 :Data;
  stdoutTruncated @4 :Bool;
  stderrTruncated @5 :Bool;
  durationUs @6 :UInt64;
  error @7 :Text;            # non-empty when the command could not be started (e.g. ENOENT)
}

enum StreamKind {
  stdout @0;
  stderr @1;
}

interface OutputSink {
  # Receives a command's output as it is produced. Flow-controlled: the agent stops reading the
  # command's pipes while the host is behind.
  write @0 (kind :StreamKind, data :Data) -> stream;
}

struct ProcessInfo {
  pid @0 :UInt32;
  command @1 :Text;
  running @2 :Bool;
  exitCode @3 :Int32;
  startedAtMs @4 :UInt64;
  pty @5 :Bool;              # runs on a terminal
}

enum FileType {
  regular @0;
  directory @1;
  symlink @2;
  other @3;
}

struct FileStat {
  name @0 :Text;
  type @1 :FileType;
  size @2 :UInt64;
  mode @3 :UInt32;
  mtimeMs @4 :Int64;
  owner @5 :Text;            # the owner's and group's names in the guest (or their numbers)
  group @6 :Text;
  symlinkTarget @7 :Text;    # a symbolic link's target, as written in it
  metadata @8 :List(EnvVar); # the file's `user.e2b.*` extended attributes, prefix stripped
                             # (name order; at most 4096 bytes of names and values)
}

struct Error {
  # A failed file operation. `code` is a stable name ("not_found", "not_a_directory",
  # "is_a_directory", "permission_denied", "exists", "invalid_argument", "io_error").
  code @0 :Text;
  message @1 :Text;
}

enum WatchEventKind {
  create @0;    # made, or moved in
  write @1;     # its content changed
  remove @2;
  rename @3;    # moved away (the new name, when inside the watched tree, comes as a create)
  chmod @4;     # mode, owner or times changed
  overflow @5;  # events were lost (the guest kernel's queue overflowed); path is empty
}

struct WatchEvent {
  kind @0 :WatchEventKind;
  path @1 :Text;   # relative to the watched directory
  isDir @2 :Bool;
  hasEntry @3 :Bool;   # watch `includeEntry`: the entry as it was when the event was read
  entry @4 :FileStat;  # (none when it is gone: a remove, a rename away)
}

interface WatchSink {
  ready @0 ();
  # The watch is in place: every change after this call is reported.
  events @1 (events :List(WatchEvent)) -> stream;
  # A batch of changes, in order (at most 256 per call). Flow-controlled: while the host is
  # behind, events wait in the guest kernel's queue (an overflow event says when some were lost).
}

interface Agent {
  health @0 () -> (version :Text, protocolVersion :UInt32, uptimeMs :UInt64, bootId :Text);

  exec @1 (request :ExecRequest) -> (result :ExecResult);
  # Runs a command to completion and returns its buffered output.

  execStream @2 (request :ExecRequest, sink :OutputSink) -> (result :ExecResult);
  # Runs a command, sending output to `sink` as it arrives; `result` carries no output.
  # If the host drops the call (cancels the promise or disconnects), the process group is killed.

  startProcess @3 (request :ExecRequest) -> (pid :UInt32, error :Text);
  # Starts a background process. Its output is buffered (last 1 MiB per stream) until streamed.
  waitProcess @4 (pid :UInt32) -> (result :ExecResult, error :Text);
  # Waits for a background process to exit; returns its buffered output.
  killProcess @5 (pid :UInt32, signal :Int32) -> (error :Text);
  # Sends `signal` (0 = SIGKILL) to the process's whole group.
  streamProcess @6 (pid :UInt32, sink :OutputSink) -> (result :ExecResult, error :Text);
  # Sends buffered and then live output of a background process to `sink` until it exits.
  listProcesses @7 () -> (processes :List(ProcessInfo));

  readFile @8 (path :Text, offset :UInt64, length :UInt32) -> (data :Data, size :UInt64, error :Error);
  # Reads at most `length` bytes (capped at 4 MiB) from `offset`; `size` is the file's size.
  writeFile @9 (path :Text, data :Data, mode :UInt32, makeParents :Bool, append :Bool, truncate :Bool,
                owner :Text, setMetadata :Bool, metadata :List(EnvVar)) -> (error :Error);
  # Writes `data`. With truncate the file is replaced first (created with `mode`, 0 = 0644);
  # with append the data goes at the end. Large files are written as a truncate call followed by
  # append calls. `owner` (an account of the guest's, "" = root): what this call creates (the file,
  # parent folders) belongs to it; an existing file keeps its owner. `setMetadata`: after the
  # write, the file's `user.e2b.*` extended attributes are exactly `metadata` (names without the
  # prefix; invalid_argument when the file system has no user xattrs and `metadata` is not empty).
  listDir @10 (path :Text) -> (entries :List(FileStat), error :Error);
  stat @11 (path :Text) -> (stat :FileStat, error :Error);
  remove @12 (path :Text, recursive :Bool) -> (error :Error);
  rename @13 (from :Text, to :Text) -> (error :Error);
  mkdir @14 (path :Text, parents :Bool, mode :UInt32, owner :Text) -> (error :Error);
  # `owner` as for writeFile: the folders this call makes belong to it.

  setClock @15 (unixNanos :Int64) -> ();
  # Sets the guest's realtime clock (called after every restore: a snapshot's clock is stale).
  reseedRng @16 (entropy :Data) -> ();
  # Mixes host entropy into the kernel RNG and credits it (called after every restore/fork, so
  # that forks never share random state).
  setHostname @17 (hostname :Text) -> ();

  writeStdin @19 (pid :UInt32, data :Data, close :Bool) -> (error :Text);
  # Writes to the stdin of a background process started with keepStdinOpen; `close` closes it
  # (after `data`). Writes are applied in order.

  setNetwork @20 (enabled :Bool) -> ();
  # Whether the sandbox has a network (called after every restore; a snapshot may come from a
  # sandbox with the other setting). Without one, eth0 is down: connections and name lookups fail
  # at once (ENETUNREACH) instead of waiting out timeouts on a NIC that leads nowhere. With one,
  # eth0 is configured and up (address, default route, resolver).

  mountVolume @21 (slot :UInt8, path :Text, readOnly :Bool, sizeBytes :UInt64) -> (error :Error);
  # Mounts the volume the host bound to block slot `slot` (the virtio-blk disk whose serial is
  # "pds-vol<slot>") at `path` (made with its parents), as ext4; read-only volumes are mounted
  # read-only without journal replay. The host grows a slot's capacity when it binds a volume:
  # the call first waits (at most 2 s) until the guest sees the disk at `sizeBytes`.

  resizePty @22 (pid :UInt32, cols :UInt16, rows :UInt16) -> (error :Text);
  # Sets the terminal size of a background process started with `pty` (its process group gets
  # SIGWINCH).

  watch @23 (path :Text, recursive :Bool, sink :WatchSink, includeEntry :Bool) -> (error :Error);
  # Reports changes in the directory `path` (with `recursive`, in its subdirectories too, those
  # made later included; at most 10,000 directories) to `sink` until the host drops the call.
  # Returns at once with an error when the path cannot be watched (not_found, not_a_directory,
  # too_many), or when the directory itself is removed or moved (after a remove event).
  # `includeEntry`: each event carries the entry (lstat when the event is read; best effort).

  setFreePageReporting @24 (enabled :Bool) -> ();
  # Whether the guest reports its free memory to the host through the balloon (called after every
  # restore): yes when its RAM is a file of its own (the host punches the pages out of it), no
  # when it maps a shared memory base copy-on-write (the host cannot take them back). The agent
  # binds or unbinds the balloon's driver in the background, in the order asked (it replies at
  # once; a failure is in its log); a machine without a balloon has nothing to do.

  endSession @18 () -> ();
  # Ends this session (before a reconnect or a snapshot): the agent replies, tears the session
  # down (calls in flight are cancelled) and waits for the next session preamble.
}

# Session preamble. Every session starts with the host writing `sessionMagic` (8 bytes) + a nonce
# (8 bytes) on the raw channel; the agent discards bytes until it has read that, answers it
# (sessionAckMagic, below), then serves RPC from the next byte. So a host never lands in a stale session: not after a reconnect (QEMU notices
# a host hang-up only lazily, and throttles VSERPORT_CHANGE), and not after a restore.
const sessionMagic :Data = "PSTKGO\x00\x01";

# The agent's answer to a preamble, before the first RPC byte of the session: `sessionAckMagic` +
# the preamble's nonce. The host discards bytes until it has read that: what an earlier session
# of the agent wrote after its host had gone (an abort, a late reply) is never read as this
# session's RPC.
const sessionAckMagic :Data = "PSTKOK\x00\x01";
