"""A version served in shards of whole segments on Ray Serve (issue 57): `tandem serve --cluster`'s part.

The only package that imports Ray Serve. The search itself (the shard side, the statistics round, the merge and the
fetch) is models.search.shards, which imports no Ray: here are the deployments that hold the shards (`replica`), the
handles the coordinator reaches them through (`handles`) and the coordinator that pins a version and moves to the
next only when every shard has loaded it (`coordinator`). The single-box service imports nothing of it (pyproject's
import contracts); docs/operations.md#sharded-serving-on-ray-serve says how to run it.
"""
