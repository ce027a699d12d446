#!/bin/sh
# Run as root in the postgres template's guest before its bake, with an empty ext4 data volume
# mounted at /var/lib/postgresql: a cluster made there, listening on every address (connections
# reach the guest only through ports the daemon exposes), host logins by SCRAM password only, the
# server started and asked once so its caches are warm in the snapshot. No role but `postgres`
# (peer login inside the guest only) exists: each database gets its own role and password at create.
set -eu
chown postgres:postgres /var/lib/postgresql
rm -rf /etc/postgresql/15/main
pg_createcluster 15 main -- --auth-local=peer --auth-host=scram-sha-256 >/dev/null
cat >> /etc/postgresql/15/main/postgresql.conf <<'CONF'
listen_addresses = '*'
password_encryption = 'scram-sha-256'
CONF
echo 'host all all 0.0.0.0/0 scram-sha-256' >> /etc/postgresql/15/main/pg_hba.conf
pg_ctlcluster 15 main start </dev/null >/dev/null 2>&1
runuser -u postgres -- psql -qAtc 'select 1' >/dev/null
sync
