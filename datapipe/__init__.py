"""datapipe: pack image folders into LMDB / HDF5 / WebDataset and feed PyTorch training at full speed."""
from .backends import Batch, Loader, LoaderOptions, make_loader
from .backends.base import BadSample, TooManyBadSamples
from .formats import open_dataset, read_manifest
from .records import ClassIndex, Manifest, Record, Sample, SplitNotFound

__version__ = "0.1.0"
__all__ = ["make_loader", "Batch", "Loader", "LoaderOptions", "BadSample", "TooManyBadSamples", "open_dataset", "read_manifest", "Sample", "Record", "SplitNotFound", "Manifest", "ClassIndex", "__version__"]
