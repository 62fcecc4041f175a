"""Offline packing of image folders into LMDB, HDF5 or WebDataset shards (no format knowledge here)."""
from .convert import convert
from .pack import ConvertError, ConvertOptions, ConvertReport
from .plan import Plan, Task, make_plan

__all__ = ["convert", "ConvertOptions", "ConvertReport", "ConvertError", "make_plan", "Plan", "Task"]
