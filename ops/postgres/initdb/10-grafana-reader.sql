-- Run once by the postgres container of docker-compose.yml when it creates its database
-- (mounted at /docker-entrypoint-initdb.d), as POSTGRES_USER — the user the sink writes as.
--
-- Grafana reads the sink's tables as grafana_reader, which may only SELECT: the schema is
-- created here, and every table the sink creates in it later is readable by that role.
-- DEV STACK ONLY: the password below is a development default (docker-compose.yml and
-- ops/grafana/provisioning/datasources/postgres.yml use it too); change all three for
-- anything real.
DO $$
BEGIN
    CREATE ROLE grafana_reader LOGIN PASSWORD 'grafana-reader-dev';
EXCEPTION WHEN duplicate_object THEN
    RAISE NOTICE 'role grafana_reader exists already';
END
$$;
CREATE SCHEMA IF NOT EXISTS stream_dp;
GRANT USAGE ON SCHEMA stream_dp TO grafana_reader;
ALTER DEFAULT PRIVILEGES IN SCHEMA stream_dp GRANT SELECT ON TABLES TO grafana_reader;
