"""The epoch order, computed not stored: keyed permutations, ranks and workers, shard-wise reading.
Pure arithmetic over record counts: may import only the leaves (errors, checks)."""
