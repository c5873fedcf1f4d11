"""The ingest side: a file in, its complete record out (`record.build_record`; the store
writes it through `app.ingest.ingest_path`).

source (read, identify) → pdf / html / text (+ ocr) (parse) → document.assemble (lay out) →
sections, anchors (structure) → chunks, passages (cut) → record (passages' titles, search text).
"""

# The default segment size (`docqa ingest --segment-tokens`; review and the library use it
# too). Here, not in chunks.py, so that the CLI shows it without importing the document models.
SEGMENT_TOKENS = 2048
