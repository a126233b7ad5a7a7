"""Per-source adapters that turn raw event files into one staged DataFrame for `jobs.ingest_events`.

Each adapter returns a `Staged` frame: one row per input record (header lines excluded), the raw record kept, a
structural reject reason where the record could not be split into fields, and the source's fields as strings.
`canonical.canonicalize` then validates ids, event types and timestamps the same way for every source.
"""
