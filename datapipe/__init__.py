"""datapipe: pack image folders into LMDB / HDF5 / WebDataset and feed PyTorch training at full speed."""
from .formats import open_dataset, read_manifest
from .records import ClassIndex, Manifest, Record, Sample

__version__ = "0.1.0"
__all__ = ["open_dataset", "read_manifest", "Sample", "Record", "Manifest", "ClassIndex", "__version__"]
