"""CCL-D: detect and localize slow and hung collective communication in model training."""

__version__ = "0.1.0"

__all__ = ["__version__"]
