"""The document side, pure (no database, no engine): `ingest/` turns a file into the record
the store writes, `answer/` turns a question over records into a cited answer. Shared by
both: `document` (the models and the one provenance `Span`), `fulltext` (FTS5 text and
queries), `textnorm`, `errors`."""
