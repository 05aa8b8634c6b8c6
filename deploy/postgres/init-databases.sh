#!/bin/sh
# Runs once, when the PostgreSQL data volume is first initialised (docker-entrypoint-initdb.d).
# One server, three databases with their own roles: Temporal's persistence and visibility stores, and the crewwork
# store. Passwords come from the environment (an .env file or secrets), never from the image or this file.
set -eu

: "${TEMPORAL_DB_PASSWORD:?set TEMPORAL_DB_PASSWORD}"
: "${CREWWORK_DB_PASSWORD:?set CREWWORK_DB_PASSWORD}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v temporal_pw="$TEMPORAL_DB_PASSWORD" -v crewwork_pw="$CREWWORK_DB_PASSWORD" <<'SQL'
CREATE ROLE temporal LOGIN PASSWORD :'temporal_pw';
CREATE ROLE crewwork LOGIN PASSWORD :'crewwork_pw';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
CREATE DATABASE crewwork OWNER crewwork;
REVOKE ALL ON DATABASE temporal, temporal_visibility FROM PUBLIC;
REVOKE ALL ON DATABASE crewwork FROM PUBLIC;
SQL
