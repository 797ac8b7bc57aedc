-- TAUdb schema, version 2 ("Changes after Nov. 9, 2012 release"), for PostgreSQL.
--
-- The tables, columns, types, seeded rows, indexes and views of TAU's TAUdb
-- (tools/src/perfdmf/etc/taudb.sql), so that ParaProf, PerfExplorer and the
-- TAUdb C API read what Kipimo stores. One deliberate change, in the last
-- view: TAU defines atomic_mean_summary with "WHERE thread >= -1", which
-- returns every real thread as well as the mean; here it is "thread = -1",
-- like interval_mean_summary. (TAU's loaders store no derived counter rows,
-- so on their data the view was empty of means either way.)
--
-- Applied in one transaction by `kipimo taudb configure` when the database
-- has no schema_version table yet.

-- Static tables -------------------------------------------------------------

CREATE TABLE schema_version (
    version     INT NOT NULL,
    description VARCHAR NOT NULL
);
-- 0 = PerfDMF (original), 1 = TAUdb (April 2012), 2 = this schema.
INSERT INTO schema_version (version, description)
    VALUES (2, 'Changes after Nov. 9, 2012 release');

-- The parsers a trial can come from.
CREATE TABLE data_source (
    id          INT UNIQUE NOT NULL,
    name        VARCHAR NOT NULL,
    description VARCHAR
);
INSERT INTO data_source (name, id, description) VALUES
    ('ppk', 0, 'TAU Packed profiles (TAU)'),
    ('TAU profiles', 1, 'TAU profiles (TAU)'),
    ('DynaProf', 2, 'PAPI DynaProf profiles (UTK)'),
    ('mpiP', 3, 'mpiP: Lightweight, Scalable MPI Profiling (Vetter, Chambreau)'),
    ('HPM', 4, 'HPM Toolkit profiles (IBM)'),
    ('gprof', 5, 'gprof profiles (GNU)'),
    ('psrun', 6, 'PerfSuite psrun profiles (NCSA)'),
    ('pprof', 7, 'TAU pprof.dat output (TAU)'),
    ('Cube', 8, 'Cube data (FZJ)'),
    ('HPCToolkit', 9, 'HPC Toolkit profiles (Rice Univ.)'),
    ('SNAP', 10, 'TAU Snapshot profiles (TAU)'),
    ('OMPP', 11, 'OpenMP Profiler profiles (Fuerlinger)'),
    ('PERIXML', 12, 'Data Exchange Format (PERI)'),
    ('GPTL', 13, 'General Purpose Timing Library (ORNL)'),
    ('Paraver', 14, 'Paraver profiles (BSC)'),
    ('IPM', 15, 'Integrated Performance Monitoring (NERSC)'),
    ('Google', 16, 'Google profiles (Google)'),
    ('Cube3', 17, 'Cube 3D profiles (FZJ)'),
    ('Gyro', 100, 'Self-timing profiles from Gyro application'),
    ('GAMESS', 101, 'Self-timing profiles from GAMESS application'),
    ('Other', 999, 'Other profiles');

-- Thread indexes of the derived (statistics) threads.
CREATE TABLE derived_thread_type (
    id          INT NOT NULL,
    name        VARCHAR NOT NULL,
    description VARCHAR NOT NULL
);
INSERT INTO derived_thread_type (id, name, description) VALUES
    (-1, 'MEAN', 'MEAN (nulls ignored)'),
    (-2, 'TOTAL', 'TOTAL'),
    (-3, 'STDDEV', 'STDDEV (nulls ignored)'),
    (-4, 'MIN', 'MIN'),
    (-5, 'MAX', 'MAX'),
    (-6, 'MEAN', 'MEAN (nulls are 0 value)'),
    (-7, 'STDDEV', 'STDDEV (nulls are 0 value)');

-- Trials ------------------------------------------------------------------

CREATE TABLE trial (
    id                  SERIAL NOT NULL PRIMARY KEY,
    name                VARCHAR,
    data_source         INT,
    node_count          INT,  -- number of processes
    contexts_per_node   INT,  -- largest context id + 1
    threads_per_context INT,  -- largest thread id + 1
    total_threads       INT,  -- number of real threads
    FOREIGN KEY (data_source) REFERENCES data_source (id)
        ON DELETE NO ACTION ON UPDATE NO ACTION
);

-- Data dimensions ---------------------------------------------------------

-- Locations; derived threads have all four numbers equal to -1..-7.
CREATE TABLE thread (
    id           SERIAL NOT NULL PRIMARY KEY,
    trial        INT NOT NULL,
    node_rank    INT NOT NULL,
    context_rank INT NOT NULL,
    thread_rank  INT NOT NULL,
    thread_index INT NOT NULL,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);

CREATE TABLE metric (
    id      SERIAL NOT NULL PRIMARY KEY,
    trial   INT NOT NULL,
    name    VARCHAR NOT NULL,
    derived BOOLEAN NOT NULL DEFAULT FALSE,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);

-- Flat timers (regions of code).
CREATE TABLE timer (
    id                SERIAL NOT NULL PRIMARY KEY,
    trial             INT NOT NULL,
    name              VARCHAR NOT NULL,
    short_name        VARCHAR NOT NULL,
    source_file       VARCHAR,
    line_number       INT,
    line_number_end   INT,
    column_number     INT,
    column_number_end INT,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX timer_trial_index ON timer (trial, name);

-- Timer related tables ----------------------------------------------------

CREATE TABLE timer_group (
    timer      INT,
    group_name VARCHAR NOT NULL,
    FOREIGN KEY (timer) REFERENCES timer (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX timer_group_index ON timer_group (timer, group_name);

CREATE TABLE timer_parameter (
    timer           INT,
    parameter_name  VARCHAR NOT NULL,
    parameter_value VARCHAR NOT NULL,
    FOREIGN KEY (timer) REFERENCES timer (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);

-- Call-graph nodes; roots (parent NULL) are the flat timers.
CREATE TABLE timer_callpath (
    id     SERIAL NOT NULL PRIMARY KEY,
    timer  INT NOT NULL,
    parent INT,
    FOREIGN KEY (timer) REFERENCES timer (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (parent) REFERENCES timer_callpath (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);

-- Phases of execution (snapshots, context metadata).
CREATE TABLE time_range (
    id              SERIAL NOT NULL PRIMARY KEY,
    iteration_start INT NOT NULL,
    iteration_end   INT,
    time_start      BIGINT NOT NULL,
    time_end        BIGINT
);

-- A call-graph node as seen by one thread.
CREATE TABLE timer_call_data (
    id             SERIAL NOT NULL PRIMARY KEY,
    timer_callpath INT NOT NULL,
    thread         INT NOT NULL,
    calls          INT,
    subroutines    INT,
    time_range     INT,
    FOREIGN KEY (timer_callpath) REFERENCES timer_callpath (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (thread) REFERENCES thread (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (time_range) REFERENCES time_range (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);

-- One metric of one call-graph node on one thread.
CREATE TABLE timer_value (
    timer_call_data       INT NOT NULL,
    metric                INT NOT NULL,
    inclusive_value       DOUBLE PRECISION,
    exclusive_value       DOUBLE PRECISION,
    inclusive_percent     DOUBLE PRECISION,
    exclusive_percent     DOUBLE PRECISION,
    sum_exclusive_squared DOUBLE PRECISION,
    FOREIGN KEY (timer_call_data) REFERENCES timer_call_data (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (metric) REFERENCES metric (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX timer_value_index ON timer_value (timer_call_data, metric);

-- Counter related tables --------------------------------------------------

CREATE TABLE counter (
    id    SERIAL NOT NULL PRIMARY KEY,
    trial INT NOT NULL,
    name  VARCHAR NOT NULL,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX counter_trial_index ON counter (trial, name);

-- standard_deviation holds the profile's sum of squares, as TAU's loaders
-- store it and TAU's readers read it back.
CREATE TABLE counter_value (
    counter            INT NOT NULL,
    timer_callpath     INT,
    thread             INT NOT NULL,
    sample_count       INT,
    maximum_value      DOUBLE PRECISION,
    minimum_value      DOUBLE PRECISION,
    mean_value         DOUBLE PRECISION,
    standard_deviation DOUBLE PRECISION,
    FOREIGN KEY (counter) REFERENCES counter (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (timer_callpath) REFERENCES timer_callpath (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (thread) REFERENCES thread (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX counter_value_index ON counter_value (counter, thread);

-- Metadata ----------------------------------------------------------------

-- Trial-level name/value pairs (the same on every thread).
CREATE TABLE primary_metadata (
    trial INT NOT NULL,
    name  VARCHAR NOT NULL,
    value VARCHAR,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX primary_metadata_index ON primary_metadata (trial, name);

-- Per-thread, per-context, nested or array metadata.
CREATE TABLE secondary_metadata (
    id             VARCHAR NOT NULL PRIMARY KEY,
    trial          INT NOT NULL,
    thread         INT,
    timer_callpath INT,
    time_range     INT,
    parent         VARCHAR,
    name           VARCHAR NOT NULL,
    value          VARCHAR,
    is_array       BOOLEAN DEFAULT FALSE,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (thread) REFERENCES thread (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (timer_callpath) REFERENCES timer_callpath (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (parent) REFERENCES secondary_metadata (id) ON DELETE NO ACTION ON UPDATE NO ACTION,
    FOREIGN KEY (time_range) REFERENCES time_range (id) ON DELETE NO ACTION ON UPDATE NO ACTION
);
CREATE INDEX secondary_metadata_index ON secondary_metadata (trial, name, thread, parent);

-- Views (ParaProf's trial tree; tables, not SQL views) ----------------------

CREATE TABLE taudb_view (
    id      SERIAL NOT NULL PRIMARY KEY,
    parent  INTEGER NULL,
    name    VARCHAR NOT NULL,
    conjoin VARCHAR NOT NULL,
    FOREIGN KEY (parent) REFERENCES taudb_view (id) ON DELETE CASCADE ON UPDATE CASCADE
);

CREATE TABLE taudb_view_parameter (
    taudb_view  INTEGER NOT NULL,
    table_name  VARCHAR NOT NULL,
    column_name VARCHAR NOT NULL,  -- the metadata name for the metadata tables
    operator    VARCHAR NOT NULL,
    value       VARCHAR NOT NULL,
    FOREIGN KEY (taudb_view) REFERENCES taudb_view (id) ON DELETE CASCADE ON UPDATE CASCADE
);

-- The root view; sub-views need it to have a parameter.
INSERT INTO taudb_view (parent, name, conjoin) VALUES (NULL, 'All Trials', 'and');
INSERT INTO taudb_view_parameter (taudb_view, table_name, column_name, operator, value)
    VALUES (1, 'trial', 'total_threads', '>', '-1');

-- PerfExplorer ------------------------------------------------------------

CREATE TABLE analysis_settings (
    id                  SERIAL NOT NULL PRIMARY KEY,
    taudb_view          INTEGER NULL,
    application         INTEGER NULL,
    experiment          INTEGER NULL,
    trial               INTEGER NULL,
    metric              INTEGER NULL,
    method              VARCHAR(255) NOT NULL,
    dimension_reduction VARCHAR(255) NOT NULL,
    normalization       VARCHAR(255) NOT NULL,
    FOREIGN KEY (taudb_view) REFERENCES taudb_view (id) ON DELETE CASCADE ON UPDATE CASCADE,
    FOREIGN KEY (trial) REFERENCES trial (id) ON DELETE CASCADE ON UPDATE CASCADE,
    FOREIGN KEY (metric) REFERENCES metric (id) ON DELETE CASCADE ON UPDATE CASCADE
);

CREATE TABLE analysis_result (
    id                SERIAL NOT NULL PRIMARY KEY,
    analysis_settings INTEGER NOT NULL,
    description       VARCHAR(255) NOT NULL,
    thumbnail_size    INTEGER NULL,
    image_size        INTEGER NULL,
    thumbnail         BYTEA NULL,
    image             BYTEA NULL,
    result_type       INTEGER NOT NULL
);

-- Indexes -----------------------------------------------------------------

CREATE INDEX trial_name_index ON trial (name);
CREATE INDEX timer_name_index ON timer (name);
CREATE INDEX timer_callpath_parent ON timer_callpath (parent);
CREATE INDEX thread_trial ON thread (trial);
CREATE INDEX timer_call_data_timer_callpath ON timer_call_data (timer_callpath);
CREATE INDEX counter_name_index ON counter (name);
CREATE INDEX timer_call_data_thread ON timer_call_data (thread);

-- Compatibility views for PerfDMF-era chart code and PerfExplorer ----------

DROP VIEW IF EXISTS interval_location_profile;
DROP VIEW IF EXISTS interval_mean_summary;
DROP VIEW IF EXISTS interval_total_summary;
DROP VIEW IF EXISTS interval_event_value;
DROP VIEW IF EXISTS interval_event;
DROP VIEW IF EXISTS atomic_location_profile;
DROP VIEW IF EXISTS atomic_mean_summary;
DROP VIEW IF EXISTS atomic_total_summary;
DROP VIEW IF EXISTS atomic_event_value;
DROP VIEW IF EXISTS atomic_event;

CREATE OR REPLACE VIEW interval_event
    (id, trial, name, group_name, source_file, line_number, line_number_end)
AS SELECT tcp.id, t.trial, t.name, tg.group_name, t.source_file, t.line_number, t.line_number_end
   FROM timer_callpath tcp
   INNER JOIN timer t ON tcp.timer = t.id
   INNER JOIN timer_group tg ON tg.timer = t.id;

CREATE OR REPLACE VIEW interval_event_value
    (interval_event, node, context, thread, metric, inclusive_percentage, inclusive,
     exclusive_percentage, exclusive, call, subroutines, inclusive_per_call, sum_exclusive_squared)
AS SELECT tcd.timer_callpath, t.node_rank, t.context_rank, t.thread_rank, tv.metric,
          tv.inclusive_percent, tv.inclusive_value, tv.exclusive_percent, tv.exclusive_value,
          tcd.calls, tcd.subroutines, tv.inclusive_value / tcd.calls, tv.sum_exclusive_squared
   FROM timer_value tv
   INNER JOIN timer_call_data tcd ON tv.timer_call_data = tcd.id
   INNER JOIN thread t ON tcd.thread = t.id;

CREATE OR REPLACE VIEW interval_location_profile
AS SELECT * FROM interval_event_value WHERE thread >= 0;

CREATE OR REPLACE VIEW interval_total_summary
AS SELECT * FROM interval_event_value WHERE thread = -2;

CREATE OR REPLACE VIEW interval_mean_summary
AS SELECT * FROM interval_event_value WHERE thread = -1;

CREATE OR REPLACE VIEW atomic_event
    (id, trial, name, group_name, source_file, line_number)
AS SELECT c.id, c.trial, c.name, NULL, NULL, NULL
   FROM counter c;

CREATE OR REPLACE VIEW atomic_event_value
    (atomic_event, node, context, thread, sample_count, maximum_value, minimum_value,
     mean_value, standard_deviation)
AS SELECT cv.counter, t.node_rank, t.context_rank, t.thread_rank, cv.sample_count,
          cv.maximum_value, cv.minimum_value, cv.mean_value, cv.standard_deviation
   FROM counter_value cv
   INNER JOIN thread t ON cv.thread = t.id;

CREATE OR REPLACE VIEW atomic_location_profile
AS SELECT * FROM atomic_event_value WHERE thread >= 0;

CREATE OR REPLACE VIEW atomic_total_summary
AS SELECT * FROM atomic_event_value WHERE thread = -2;

-- TAU has "thread >= -1" here; see the note at the top of this file.
CREATE OR REPLACE VIEW atomic_mean_summary
AS SELECT * FROM atomic_event_value WHERE thread = -1;
