"""Authoring composites: the ``fusekit.composite`` decorator."""
