"""mmlab: reproduce, measure and explain Linux memory-management performance reports."""

__version__ = "0.1.0"
