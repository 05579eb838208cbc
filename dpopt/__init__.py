"""dpopt: optimal strategies for answering linear counting queries under differential privacy."""

__version__ = "0.1.0"
