"""The one definition of GPUOS's version (setup.py reads it; the extension is built with it)."""
__version__ = "0.2.0"
