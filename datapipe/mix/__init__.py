"""datapipe.Mix: several datasets read as one weighted stream: the sources and weights, the draws of an
epoch, its order, the mixed dataset. May import augment, formats, order, storage and the leaves."""
from .sources import Mix, Source

__all__ = ["Mix", "Source"]
