"""The types every layer shares: columns and their encodings, data-file metadata as JSON.

A leaf: it imports nothing else of the service, so that the data plane (``service.data``) and the
catalog side (``service.iceberg``) can both use it without importing each other.
"""
