-- SPDX-License-Identifier: MIT
-- deploy/grafana/views.sql — read-only views of a GNMR PostgreSQL store
-- (gnmrd --store postgresql://...) for Grafana's PostgreSQL data source and
-- for fleet-wide SQL. Times are timestamptz (the store keeps milliseconds
-- since the epoch). Apply after gnmrd created the schema, as the store's
-- owner:   psql "postgresql://..." -f deploy/grafana/views.sql
-- and grant Grafana's role SELECT on the views only:
--   GRANT SELECT ON gnmr_jobs, gnmr_steps, gnmr_events, gnmr_unit_exceeds
--     TO grafana;
-- Re-running it replaces the views (CREATE OR REPLACE).

-- Every run of every job, newest state.
CREATE OR REPLACE VIEW gnmr_jobs AS
SELECT j.name AS job, j.run, j.state, j.pass, j.last_step, j.reporters,
       j.owner, to_timestamp(j.created_at / 1000.0) AS created,
       to_timestamp(j.updated_at / 1000.0) AS updated,
       j.run = (SELECT max(run) FROM jobs k WHERE k.name = j.name) AS latest
FROM jobs j;

-- One row per decided step: how many units took the recovery path, how
-- many were risky, and how the step was decided.
CREATE OR REPLACE VIEW gnmr_steps AS
SELECT to_timestamp(s.at / 1000.0) AS time, s.job, s.run, s.pass, s.step,
       s.n_active, s.risky, s.pool, s.reports, s.missing,
       s.by_deadline <> 0 AS by_deadline, s.latency_us, s.active
FROM steps s;

-- The policy's and gnmrd's events, with the unit's name.
CREATE OR REPLACE VIEW gnmr_events AS
SELECT to_timestamp(e.at / 1000.0) AS time, e.job, e.run, e.pass, e.step,
       e.kind, e.unit, u.name AS unit_name, e.outcome, e.norm,
       e.g AS gnmr, e.d AS delta_gnmr, e.s AS score, e.count, e.detail
FROM events e
LEFT JOIN units u ON u.run = e.run AND u.id = e.unit;

-- Exceeds per unit name across every run of every job: which operators
-- go unstable, fleet-wide.
CREATE OR REPLACE VIEW gnmr_unit_exceeds AS
SELECT u.name AS unit_name, e.job, count(*) AS exceeds,
       count(DISTINCT e.run) AS runs,
       count(*) FILTER (WHERE e.outcome = 'selected') AS selected,
       to_timestamp(max(e.at) / 1000.0) AS last_seen
FROM events e
JOIN units u ON u.run = e.run AND u.id = e.unit
WHERE e.kind = 'exceed'
GROUP BY u.name, e.job;
