"""PySpark integration for sessionstore (see the Spark adapter issue)."""
