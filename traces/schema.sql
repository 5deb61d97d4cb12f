-- libfsdp event traces, schema version 3 (PRAGMA user_version).
--
-- One database holds any number of runs. Times are seconds: host_time is the rank's host clock
-- when an op was issued; start_time and end_time are its execution interval on the device (the
-- sim's virtual clocks), equal for instant events. Byte counts are after the allocator's rounding
-- where the emitter says so. The library builds this text in and runs it on a database whose
-- user_version is 0 (a new file); a version 1 file (the events as one table with its texts in
-- every row) or a version 2 file (no ranks table) is converted when a run is added to it and
-- read as it is; a newer one is refused.

PRAGMA user_version = 3;

CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    created TEXT NOT NULL,             -- ISO 8601, UTC
    backend TEXT NOT NULL,             -- "sim", "gpu"
    world_size INTEGER NOT NULL,
    strategy TEXT,                     -- "full_shard", ...
    config TEXT,                       -- every option, JSON
    profile TEXT,                      -- cluster profile, JSON
    version TEXT NOT NULL,             -- library version
    command_line TEXT,
    finished INTEGER NOT NULL DEFAULT 0 -- 1 once the trace was closed
);

-- The ranks a run traced, and the ranks each stands for: a simulated rank of a symmetric plan
-- (fsdp_sim_params_t.represent) runs for a class of ranks that run alike, and its events and
-- steps are theirs too; any other traced rank stands for itself. members lists the class as
-- comma-separated items: "a" (rank a), "a-b" (a to b), "a-b:s" (every s-th rank from a to b).
-- A run of an older version has no rows here: each of its ranks stands for itself.
CREATE TABLE IF NOT EXISTS ranks (
    run INTEGER NOT NULL REFERENCES runs(id),
    rank INTEGER NOT NULL,
    stands_for INTEGER NOT NULL,       -- how many ranks, itself included
    members TEXT NOT NULL,             -- which: "0-6", "8-16376:8,16379", ...
    PRIMARY KEY (run, rank)
) WITHOUT ROWID;

-- Every text of an event (kind, name, unit, stream, dtype, group) is stored once, here, and
-- referred to by id: a run repeats a few dozen texts millions of times.
CREATE TABLE IF NOT EXISTS strings (
    id INTEGER PRIMARY KEY,
    text TEXT NOT NULL UNIQUE
);

-- The events as stored: the text columns are ids into strings. Read them through the view
-- `events` below, which has the texts.
CREATE TABLE IF NOT EXISTS event_rows (
    run INTEGER NOT NULL REFERENCES runs(id),
    rank INTEGER NOT NULL,
    seq INTEGER NOT NULL,              -- per rank: 0, 1, ... in issue order
    kind INTEGER NOT NULL REFERENCES strings(id),
    name INTEGER NOT NULL REFERENCES strings(id),
    unit INTEGER REFERENCES strings(id),
    stream INTEGER REFERENCES strings(id),
    host_time REAL NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    bytes INTEGER NOT NULL,            -- by kind: see below
    count INTEGER NOT NULL,            -- by kind: see below
    dtype INTEGER REFERENCES strings(id),
    grp INTEGER REFERENCES strings(id),
    allocated INTEGER NOT NULL,        -- bytes allocated on the rank after the event
    reserved INTEGER NOT NULL,         -- bytes reserved on the rank after the event
    PRIMARY KEY (run, rank, seq)
) WITHOUT ROWID;

-- The events with their texts (what the tools and the queries in README.md read):
--   kind    hook alloc free copy kernel collective record wait sync
--   name    "pre_forward", "all_gather", "gemm", a memory category, ...
--   unit    FSDP unit, or NULL
--   stream  stream name, or NULL for a host event
--   dtype   "f32", "bf16", "f16", "i32", or NULL
--   grp     communication group (unique in the run), or NULL
-- The diff and the exports read a rank's events in order through the primary key (run, rank,
-- seq) of event_rows; the left joins keep event_rows the outer loop of every query. There is
-- no other index: every insert would pay for it, and the summaries scan a run's rows anyway.
--
-- bytes and count by kind (every backend records them so; fsdp_trace_kernel_fields):
--   kernel      bytes = bytes the kernel reads and writes, count = its floating-point operations
--               (fsdp_kernel_cost, the figures the sim prices it with); dtype = the operands'
--               dtype of a GEMM, NULL for the others
--   copy        bytes = count = bytes copied
--   collective  bytes = the collective's full buffer (NCCL's nbytes: an all-gather's output, a
--               reduce-scatter's input), count = the count the rank passed (elements)
--   alloc, free bytes = the block's size
--   record      count = the record's number on the rank (1, 2, ... in issue order)
--   wait        count = the number of the record waited for (0: an event never recorded)
--   others: as their emitter documents, 0 when unused
-- fsdp-trace calibrate fits the HBM bandwidth to kernel bytes and the FLOP rates (per GEMM
-- dtype, and the vector rate of element-wise kinds) to kernel counts.
CREATE VIEW IF NOT EXISTS events AS
SELECT e.run AS run, e.rank AS rank, e.seq AS seq, k.text AS kind, n.text AS name,
       u.text AS unit, s.text AS stream, e.host_time AS host_time, e.start_time AS start_time,
       e.end_time AS end_time, e.bytes AS bytes, e.count AS count, d.text AS dtype,
       g.text AS grp, e.allocated AS allocated, e.reserved AS reserved
  FROM event_rows e
  LEFT JOIN strings k ON k.id = e.kind
  LEFT JOIN strings n ON n.id = e.name
  LEFT JOIN strings u ON u.id = e.unit
  LEFT JOIN strings s ON s.id = e.stream
  LEFT JOIN strings d ON d.id = e.dtype
  LEFT JOIN strings g ON g.id = e.grp;

CREATE TABLE IF NOT EXISTS steps (
    run INTEGER NOT NULL REFERENCES runs(id),
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    loss REAL,
    step_time REAL,                    -- seconds
    seq_end INTEGER NOT NULL,          -- the rank's events with seq < seq_end came before this row
    peak_allocated INTEGER NOT NULL,
    peak_reserved INTEGER NOT NULL,
    -- each category's own peak (fsdp_mem_stats_t.peak_by_category)
    peak_sharded_param INTEGER NOT NULL,
    peak_unsharded_param INTEGER NOT NULL,
    peak_low_prec_shard INTEGER NOT NULL,
    peak_gradient INTEGER NOT NULL,
    peak_optimizer_state INTEGER NOT NULL,
    peak_activation INTEGER NOT NULL,
    peak_comm_buffer INTEGER NOT NULL,
    peak_temporary INTEGER NOT NULL,
    -- the categories at the moment of peak_allocated (fsdp_mem_stats_t.at_peak_by_category)
    at_peak_sharded_param INTEGER NOT NULL,
    at_peak_unsharded_param INTEGER NOT NULL,
    at_peak_low_prec_shard INTEGER NOT NULL,
    at_peak_gradient INTEGER NOT NULL,
    at_peak_optimizer_state INTEGER NOT NULL,
    at_peak_activation INTEGER NOT NULL,
    at_peak_comm_buffer INTEGER NOT NULL,
    at_peak_temporary INTEGER NOT NULL,
    PRIMARY KEY (run, rank, step)
) WITHOUT ROWID;
