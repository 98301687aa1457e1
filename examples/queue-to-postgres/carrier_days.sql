-- The table the queue-to-postgres job upserts into: one row per carrier and day.
-- day_start is the window start, local midnight on New York standard time (05:00 UTC);
-- the sink's upsert key is the primary key.
CREATE TABLE carrier_days (
    carrier       text             NOT NULL,
    day_start     timestamptz      NOT NULL,
    flights       bigint           NOT NULL,  -- scheduled departures
    departed      bigint           NOT NULL,  -- of which with a dep_delay (not cancelled)
    sum_dep_delay bigint,                     -- minutes; NULL when none departed
    avg_dep_delay double precision,           -- minutes; NULL when none departed
    PRIMARY KEY (carrier, day_start)
);
