"""The one compiled part: datapipe._jpeg_region, a region (crop) JPEG decoder over the system
libjpeg-turbo. It is optional: without libjpeg headers (Debian/Ubuntu: libjpeg-dev) the build
skips it and the train view decodes whole images with simplejpeg instead (same pixels, slower)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "datapipe._jpeg_region",
    sources=["datapipe/_jpeg_region.c"],
    libraries=["jpeg"],
    extra_compile_args=["-O2"],
    optional=True,
)])
