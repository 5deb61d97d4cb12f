-- libfsdp event traces, schema version 1 (PRAGMA user_version).
--
-- One database holds any number of runs. Times are seconds: host_time is the rank's host clock
-- when an op was issued; start_time and end_time are its execution interval on the device (the
-- sim's virtual clocks), equal for instant events. Byte counts are after the allocator's rounding
-- where the emitter says so. The library builds this text in and runs it on a database whose
-- user_version is older than 1; a newer one is refused.

PRAGMA user_version = 1;

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

CREATE TABLE IF NOT EXISTS events (
    run INTEGER NOT NULL REFERENCES runs(id),
    rank INTEGER NOT NULL,
    seq INTEGER NOT NULL,              -- per rank: 0, 1, ... in issue order
    kind TEXT NOT NULL,                -- hook alloc free copy kernel collective record wait sync
    name TEXT NOT NULL,                -- "pre_forward", "all_gather", "gemm", a memory category
    unit TEXT,                         -- FSDP unit, or NULL
    stream TEXT,                       -- stream name, or NULL for a host event
    host_time REAL NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL NOT NULL,
    bytes INTEGER NOT NULL,            -- by kind: see below
    count INTEGER NOT NULL,            -- by kind: see below
    dtype TEXT,                        -- "f32", "bf16", "f16", "i32", or NULL
    grp TEXT,                          -- communication group (unique in the run), or NULL
    allocated INTEGER NOT NULL,        -- bytes allocated on the rank after the event
    reserved INTEGER NOT NULL,         -- bytes reserved on the rank after the event
    PRIMARY KEY (run, rank, seq)
) WITHOUT ROWID;

-- bytes and count by kind (every backend records them so; fsdp_trace_kernel_event_init):
--   kernel      bytes = bytes the kernel reads and writes, count = its floating-point operations
--               (fsdp_kernel_cost, the figures the sim prices it with); dtype = the operands'
--               dtype of a GEMM, NULL for the others
--   copy        bytes = count = bytes copied
--   collective  bytes = the collective's full buffer (NCCL's nbytes: an all-gather's output, a
--               reduce-scatter's input), count = the count the rank passed (elements)
--   alloc, free bytes = the block's size; others: as their emitter documents, 0 when unused
-- fsdp-trace calibrate fits the HBM bandwidth to kernel bytes and the FLOP rates (per GEMM
-- dtype, and the vector rate of element-wise kinds) to kernel counts.

-- The diff and the exports read a rank's events in order through the primary key (run, rank,
-- seq). Summaries group collectives by name, unit and rank: a partial index covers them without
-- taxing the insert of every other event (a full index costs the writer about as much as the
-- table itself).
CREATE INDEX IF NOT EXISTS events_collectives ON events (run, name, unit, rank, bytes, dtype)
    WHERE kind = 'collective';

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
