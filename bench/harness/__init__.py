"""What every bench script shares: the record (machine, load, dated record), fresh-process runs, servers."""
