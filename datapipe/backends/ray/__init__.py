"""backend="ray": a pool of Ray actors decodes and augments batches with the threads backend's planner
and CPU appliers (DecodedRecords), so a batch computed there is the batch this process would have
computed. session.py: which Ray (the one connected, else a local one on 127.0.0.1 owned by the loader);
actor.py: one actor's job (items -> a uint8 host batch); pool.py: the actors, replaced when lost, grown
and shrunk; sizing.py: pool_workers="auto"'s policy (the trainer's wait per window -> the pool's size);
loader.py: RayLoader, which leases this rank's batches, receives them in order and re-issues lost ones."""
from .loader import PoolUnavailable, RayLoader

__all__ = ["RayLoader", "PoolUnavailable"]
