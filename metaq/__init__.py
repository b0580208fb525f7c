"""metaq-py: a replication- and HA-focused message broker cluster in the line of MetaQ."""

__version__ = "0.1.0"
