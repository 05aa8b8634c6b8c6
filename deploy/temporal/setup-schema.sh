#!/bin/sh
# Creates or upgrades Temporal's schemas with Temporal's own tool (temporal-sql-tool, in temporalio/admin-tools).
# Safe to run on every `docker compose up`: setup-schema -v 0.0 only records the baseline, and update-schema
# applies just the versioned steps that are missing (this is also how a Temporal server upgrade migrates).
set -eu

SCHEMA=/etc/temporal/schema/postgresql/v12
sql() {
    temporal-sql-tool --plugin postgres12 --ep "${POSTGRES_SEEDS}" -p "${DB_PORT:-5432}" \
        -u "${POSTGRES_USER}" --pw "${POSTGRES_PWD}" "$@"
}

until nc -z "${POSTGRES_SEEDS}" "${DB_PORT:-5432}"; do
    echo "waiting for PostgreSQL at ${POSTGRES_SEEDS}:${DB_PORT:-5432}"
    sleep 1
done

sql --db temporal setup-schema -v 0.0
sql --db temporal update-schema -d "${SCHEMA}/temporal/versioned"
sql --db temporal_visibility setup-schema -v 0.0
sql --db temporal_visibility update-schema -d "${SCHEMA}/visibility/versioned"
echo "Temporal schemas are up to date"
