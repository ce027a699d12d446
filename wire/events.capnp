# Persisted sandbox lifecycle events (the payloads of the event store). Field ordinals are
# append-only; `formatVersion` is stored with every event and bumped on incompatible change.
@0xf19cfb806cc6eaec;

$import "/capnp/c++.capnp".namespace("pandastack::wire::events");

const formatVersion :UInt32 = 1;

struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}

enum Transition {
  snapshotting @0;
  forking @1;
  hibernating @2;
  waking @3;
}

enum ReapAction {
  kill @0;
  hibernate @1;
}

# What a timeout (TTL expiry or idle timeout) does; `default` (events written before the field
# existed) = hibernate for a persistent sandbox, else kill.
enum TimeoutAction {
  default @0;
  kill @1;
  hibernate @2;
}

struct Egress {
  mode @0 :Text;                 # deny_all | allow_all | allowlist
  cidrs @1 :List(Text);
  domains @2 :List(Text);
}

# A volume a sandbox has: mounted at `mount` from block slot `slot` of its VM.
struct VolumeMount {
  volume @0 :Text;
  mount @1 :Text;
  readOnly @2 :Bool;
  slot @3 :UInt32;
}

# Requests of one kind: how many went out, how many were refused.
struct EgressCount {
  allowed @0 :UInt32;
  denied @1 :UInt32;
}

# A name (or an address no answer named) and its requests of every kind.
struct EgressDestination {
  name @0 :Text;
  requests @1 :EgressCount;
}

# What a sandbox reached over a period, from its egress log (an audit record).
struct EgressSummary {
  fromMs @0 :Int64;
  toMs @1 :Int64;
  dns @2 :EgressCount;
  connections @3 :EgressCount;
  secretRequests @4 :EgressCount;  # requests that carried a secret's placeholder
  bytesOut @5 :UInt64;             # of the connections that ended in the period
  bytesIn @6 :UInt64;
  destinations @7 :List(EgressDestination);  # the most used, most requests first
  otherDestinations @8 :UInt32;    # beyond the list
}

struct SandboxEvent {
  atMs @0 :Int64;
  union {
    created :group {
      tenant @1 :Text;
      template @2 :Text;
      vcpus @3 :UInt32;
      memoryMib @4 :UInt32;
      metadata @5 :List(KeyValue);
      ttlSeconds @6 :UInt32;
      expiresAtMs @7 :Int64;
      persistent @8 :Bool;
      autoWake @9 :Bool;
      parent @10 :Text;        # the sandbox this one was forked from ("" for none)
      fromSnapshot @11 :Text;  # the snapshot it was created from ("" = its template)
      network @33 :Bool;       # the sandbox has a network (egress below)
      egress @34 :Egress;
      idleTimeoutSeconds @41 :UInt32;  # 0 = none: hibernated/killed after this long unused
      onTimeout @42 :TimeoutAction;
      volumes @48 :List(VolumeMount);  # volumes attached at create, each on its own slot
      timeoutDiskOnly @58 :Bool;       # a hibernation at its timeout keeps only the disk
    }
    started @12 :Void;
    execStarted :group {
      execId @13 :Text;
      command @14 :Text;       # the command line, not its output
    }
    execFinished :group {
      execId @15 :Text;
      exitCode @16 :Int32;
      durationMs @17 :UInt32;
      timedOut @18 :Bool;
    }
    transitionStarted :group {
      transition @19 :Transition;
      snapshotId @20 :Text;
    }
    transitionFailed :group {
      transition @21 :Transition;
      reason @22 :Text;
    }
    snapshotTaken @23 :Text;       # snapshot id
    forked @24 :List(Text);        # children's ids
    hibernated @25 :Text;          # the hibernation snapshot's id
    woke @26 :Void;
    ttlChanged :group {
      ttlSeconds @27 :UInt32;
      expiresAtMs @28 :Int64;
    }
    metadataChanged @29 :List(KeyValue);
    reaped @30 :ReapAction;
    killed @31 :Void;
    failed @32 :Text;              # reason, e.g. "host_restart"
    networkAttached @35 :UInt32;   # the VM (created or woken) runs on this host subnet
    egressChanged @36 :Egress;
    portExposed @37 :UInt32;       # guest TCP port forwarded from the host
    portUnexposed @38 :UInt32;
    snapshotDeleted @39 :Text;     # one of its named snapshots was deleted (id)
    processStarted :group {        # a background process (or a WebSocket command) started
      pid @43 :UInt32;
      command @44 :Text;           # its command line, not its output
    }
    fileWritten :group {           # a file was written through the API
      path @45 :Text;
      bytes @46 :UInt64;
    }
    fileRemoved @47 :Text;         # a file or folder was removed through the API (path)
    migrated @49 :Text;            # it moved to this host (a migration): ended here
    previewOpened :group {         # a guest port served at a preview URL (opened again: replaced)
      port @50 :UInt32;
      isPublic @51 :Bool;          # no token needed
      createdAtMs @52 :Int64;
      expiresAtMs @53 :Int64;
      nonce @54 :Text;             # bound into its tokens' HMAC: a new one revokes the old tokens
    }
    previewClosed @55 :UInt32;     # the port's preview URL was revoked
    hibernationPersisted @59 :Text;  # the hibernation (snapshot id) has a synced copy on the
                                     # data disk: it survives a host reboot
    snapshotPersisted @60 :Text;   # the named snapshot (id) has a synced copy on the data disk
    egressSummary @62 :EgressSummary;  # audit only: what it reached over a period
    hibernationUploaded :group {   # the hibernation is in the object store (off the host)
      snapshotId @63 :Text;
      manifest @64 :Text;          # its manifest's key (storage/snapshot_chunks.h)
    }
    snapshotUploaded :group {      # the named snapshot is in the object store (off the host)
      snapshotId @65 :Text;
      manifest @66 :Text;          # its manifest's key
    }
  }
  reapReason @40 :Text;            # reaped: "ttl" (expired) or "idle" (idle timeout)
  snapshotName @56 :Text;          # transitionStarted (snapshotting), snapshotTaken: the name
                                   # the snapshot is taken with ("" = none)
  diskOnly @57 :Bool;              # transitionStarted (hibernating), hibernated: the hibernation
                                   # keeps only the disk (a wake boots the guest afresh on it)
  deleteReason @61 :Text;          # snapshotDeleted: "" = by the API, else why it is gone
                                   # ("snapshot_lost": no copy survived a host reboot)
}

# Persisted volume lifecycle events (the stream `vol_...` of each volume).
struct VolumeEvent {
  atMs @0 :Int64;
  union {
    created :group {
      tenant @1 :Text;
      name @2 :Text;
      sizeMib @3 :UInt64;
      metadata @4 :List(KeyValue);
      origin @13 :Text;            # "" (made empty), or what it is a copy of (fork:..., snapshot:...)
    }
    attached :group {
      sandbox @5 :Text;
      mount @6 :Text;
      readOnly @7 :Bool;
    }
    detached :group {
      sandbox @8 :Text;
      reason @9 :Text;             # sandbox_ended, create_failed, recovery
    }
    resized @10 :UInt64;           # the new size in MiB
    metadataChanged @11 :List(KeyValue);
    deleted @12 :Void;
    snapshotted :group {
      snapshotId @14 :Text;
      sizeMib @15 :UInt64;
    }
    snapshotDeleted @16 :Text;     # its id
    arrived :group {               # from another host of a cluster (a migration), unattached
      fromHost @17 :Text;
      tenant @18 :Text;
      name @19 :Text;
      sizeMib @20 :UInt64;
      metadata @21 :List(KeyValue);
      origin @22 :Text;
      createdAtMs @23 :Int64;
      snapshots @24 :List(VolumeSnapshotRecord);
    }
    migrated @25 :Text;            # to this host (with its sandbox; its files went too)
    uploaded :group {              # its file, detached, is in the object store (off the host)
      manifest @26 :Text;          # its manifest's key (storage/snapshot_chunks.h)
      fileVersion @27 :UInt64;     # the version its file had then (VolumeState::file_version)
    }
  }
}

struct VolumeSnapshotRecord {
  id @0 :Text;
  sizeMib @1 :UInt64;
  createdAtMs @2 :Int64;
}

# One event of a managed database's stream (`db_...`): actors/database.h. No password is ever in
# it (shown once to the caller; the server holds its SCRAM verifier).
struct DatabaseEvent {
  atMs @0 :Int64;
  union {
    created :group {
      tenant @1 :Text;
      name @2 :Text;
      metadata @3 :List(KeyValue);
      sandbox @4 :Text;            # the sandbox it runs in (template postgres)
      user @5 :Text;
      database @6 :Text;
      volume @7 :Text;             # its data volume
    }
    credentialsRotated @8 :Void;
    hibernated @9 :Void;
    woken @10 :Void;
    deleted @11 :Void;
    backedUp :group {              # a pg_dump (custom format) written to the backups folder
      backup @12 :Text;            # bk_...
      bytes @13 :UInt64;
    }
    backupDeleted @14 :Text;       # bk_...
  }
}

# One event of a custom template's stream (`tpl_<name>.<tenant hash>`): actors/custom_template.h.
struct TemplateEvent {
  atMs @0 :Int64;
  union {
    buildStarted :group {
      tenant @1 :Text;
      name @2 :Text;
      from @3 :Text;                # the shipped template it builds on
      packages @4 :List(Text);
      files @5 :List(KeyValue);     # guest path -> content
      run @6 :List(Text);           # shell commands run as root in the guest before the bake
      env @7 :List(KeyValue);
      network @8 :Bool;
      memoryMib @20 :UInt32;        # its guests' shape (0: the host's default, older records)
      vcpus @21 :UInt32;
      start @24 :Text;              # what every sandbox of it runs: started before the bake
      readyPort @25 :UInt16;        # the bake waits for `start` to listen here (0: no port)
      readyCmd @26 :Text;           # or for this shell command to succeed ("": not asked)
      image @27 :Text;              # imported from an image archive ("": a build on `from`)
      contexts @32 :List(Text);     # its Dockerfile's context archives (keys), in order
    }
    built :group {
      buildMs @9 :UInt64;
      sizeBytes @10 :UInt64;
      # An imported image's own configuration, learned by its build ("": not an import).
      imageRef @28 :Text;           # its tag (if any) and config digest
      imageStart @29 :Text;         # its Entrypoint/Cmd as the start command
      imageReadyPort @30 :UInt16;   # its first exposed TCP port
      imageEnv @31 :List(KeyValue);
    }
    buildFailed :group {
      error @11 :Text;
      logTail @12 :Text;
    }
    deleted @13 :Void;
    published :group {             # made from a sandbox (its disk and memory), ready at once
      tenant @14 :Text;
      name @15 :Text;
      sandbox @16 :Text;
      from @17 :Text;              # the template the sandbox was made from
      sizeBytes @18 :UInt64;
      network @19 :Bool;
      memoryMib @22 :UInt32;        # the sandbox's shape
      vcpus @23 :UInt32;
    }
  }
}
