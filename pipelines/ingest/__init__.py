"""The ingest side: a file in, a complete record out (`record.ingest_path` is the one entry).

source (read, identify) → pdf / html / text (+ ocr) (parse) → document.assemble (lay out) →
sections, anchors (structure) → chunks, passages (cut) → record (passages' titles, search text).
"""
