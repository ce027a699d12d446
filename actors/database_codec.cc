#include "actors/database_codec.h"

#include "actors/codec_util.h"
#include "actors/event_codec.h"
#include "wire/events.capnp.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace w = pandastack::wire::events;

std::string encode_database_event(const DatabaseEvent& e) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<w::DatabaseEvent>();
  b.setAtMs(e.at_ms);
  using K = DatabaseEvent::Kind;
  switch (e.kind) {
    case K::created: {
      auto c = b.initCreated();
      c.setTenant(e.tenant);
      c.setName(e.name);
      codec::put_map(c.initMetadata(unsigned(e.metadata.size())), e.metadata);
      c.setSandbox(e.sandbox);
      c.setUser(e.user);
      c.setDatabase(e.database);
      c.setVolume(e.volume);
      break;
    }
    case K::credentials_rotated:
      b.setCredentialsRotated();
      break;
    case K::hibernated:
      b.setHibernated();
      break;
    case K::woken:
      b.setWoken();
      break;
    case K::deleted:
      b.setDeleted();
      break;
    case K::backed_up: {
      auto c = b.initBackedUp();
      c.setBackup(e.backup);
      c.setBytes(e.bytes);
      break;
    }
    case K::backup_deleted:
      b.setBackupDeleted(e.backup);
      break;
  }
  return codec::to_bytes(msg);
}

std::optional<DatabaseEvent> decode_database_event(const std::string& bytes) {
  return codec::from_bytes<w::DatabaseEvent, DatabaseEvent>(
      bytes, [](w::DatabaseEvent::Reader r) -> std::optional<DatabaseEvent> {
        DatabaseEvent e;
        e.at_ms = r.getAtMs();
        using K = DatabaseEvent::Kind;
        switch (r.which()) {
          case w::DatabaseEvent::CREATED: {
            auto c = r.getCreated();
            e.kind = K::created;
            e.tenant = c.getTenant();
            e.name = c.getName();
            e.metadata = codec::get_map(c.getMetadata());
            e.sandbox = c.getSandbox();
            e.user = c.getUser();
            e.database = c.getDatabase();
            e.volume = c.getVolume();
            break;
          }
          case w::DatabaseEvent::CREDENTIALS_ROTATED:
            e.kind = K::credentials_rotated;
            break;
          case w::DatabaseEvent::HIBERNATED:
            e.kind = K::hibernated;
            break;
          case w::DatabaseEvent::WOKEN:
            e.kind = K::woken;
            break;
          case w::DatabaseEvent::DELETED:
            e.kind = K::deleted;
            break;
          case w::DatabaseEvent::BACKED_UP:
            e.kind = K::backed_up;
            e.backup = r.getBackedUp().getBackup();
            e.bytes = r.getBackedUp().getBytes();
            break;
          case w::DatabaseEvent::BACKUP_DELETED:
            e.kind = K::backup_deleted;
            e.backup = r.getBackupDeleted();
            break;
          default:
            return std::nullopt;
        }
        return e;
      });
}

std::string database_event_to_json(const DatabaseEvent& e) {
  wire::Json j = wire::Json::object();
  j.set("kind", to_string(e.kind));
  j.set("at_ms", e.at_ms);
  if (e.kind == DatabaseEvent::Kind::created) {
    j.set("tenant", e.tenant);
    j.set("name", e.name);
    j.set("metadata", string_map_json(e.metadata));
    j.set("sandbox", e.sandbox);
    j.set("user", e.user);
    j.set("database", e.database);
    j.set("volume", e.volume);
  }
  if (e.kind == DatabaseEvent::Kind::backed_up || e.kind == DatabaseEvent::Kind::backup_deleted)
    j.set("backup", e.backup);
  if (e.kind == DatabaseEvent::Kind::backed_up) j.set("bytes", int64_t(e.bytes));
  return j.dump();
}

}  // namespace pandastack::actors
