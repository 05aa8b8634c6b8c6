#!/bin/bash
# The official postgres image's start-up contract, for Debian's PostgreSQL: on an empty $PGDATA, initdb with the
# superuser POSTGRES_USER / POSTGRES_PASSWORD (scram-sha-256 from the network), create POSTGRES_DB, run the scripts in
# /docker-entrypoint-initdb.d against a server listening on its socket only; then run the server as `postgres`.
set -euo pipefail

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
export POSTGRES_USER POSTGRES_DB

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set to initialise the database}"
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sh) echo "entrypoint: running $f"; PGHOST=/var/run/postgresql bash "$f" ;;
            *.sql) echo "entrypoint: running $f"; psql -v ON_ERROR_STOP=1 -h /var/run/postgresql \
                       -U "$POSTGRES_USER" -d "$POSTGRES_DB" -f "$f" ;;
            *) ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "entrypoint: database initialised in $PGDATA"
fi

if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
