"""The compiled parts, both optional (a failed build is skipped, and the same values come from a
slower path):
- datapipe._jpeg_region, a region (crop) JPEG decoder over the system libjpeg-turbo. Without libjpeg
  headers (Debian/Ubuntu: libjpeg-dev) the train view decodes whole images with simplejpeg instead;
- datapipe._normalize, uint8 -> normalized rows by table for the thread backend (else torch's ops);
- datapipe._warp, the recipes' affine ops (rotate, shear, translate) in one pass on uint8 pixels (else
  torch's grid_sample, ~10x the time)."""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("datapipe._jpeg_region", sources=["datapipe/_jpeg_region.c"], libraries=["jpeg"],
              extra_compile_args=["-O2"], optional=True),
    Extension("datapipe._normalize", sources=["datapipe/_normalize.c"], extra_compile_args=["-O3"],
              optional=True),
    Extension("datapipe._warp", sources=["datapipe/_warp.c"], extra_compile_args=["-O3"], optional=True),
])
