"""Offline packing of image folders into LMDB, HDF5 or WebDataset shards (no format knowledge here)."""
from .convert import convert
from .pack import ConvertError, ConvertOptions, ConvertReport
from .tasks import Task, TaskList, list_tasks

__all__ = ["convert", "ConvertOptions", "ConvertReport", "ConvertError", "list_tasks", "TaskList", "Task"]
