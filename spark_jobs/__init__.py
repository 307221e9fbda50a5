"""PySpark Structured Streaming jobs over the committed real topics (ingest, audits, reports)."""
