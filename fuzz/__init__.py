"""Fuzz targets for datapipe's parsers of untrusted bytes (see fuzz/README.md)."""
