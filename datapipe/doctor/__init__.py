"""`datapipe doctor`: the checks before blaming the input pipeline, the Ray cluster (--ray) and the GPU
self-test (selftest/). May import every datapipe package but cli."""
