"""Op data dumps inside compiled graphs (``CompilerConfig.dump_config``, ``docs/graph_dump.md``)."""
